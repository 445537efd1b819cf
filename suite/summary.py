"""The answer first: one row per comparison group saying which strategy, how fast, how much
memory (the top of BENCHMARK_REPORT.md; the method and the details follow it)."""
from __future__ import annotations

from typing import Any

from shardbench.suite.verdicts import Verdict

THROUGHPUT = "throughput"
MEMORY = ("memory: GPU training peak", "memory: model state per rank")


def _pick(v: Verdict | None) -> str:
    if v is None:
        return "-"
    if v.kind == "winner":
        return f"**{v.best.strategy}** ({v.margin_pct:.0f}% ahead of {v.second.strategy})"
    if v.kind == "equal":
        return "equal: " + ", ".join(str(c.strategy) for c in v.candidates)
    names = ", ".join(str(c.strategy) for c in v.candidates)
    return {"flagged": f"none named ({v.best.strategy} flagged)", "one repeat": f"none named (one repeat): {names}"}.get(
        v.kind, f"no significant difference: {names}")


def _value(v: Verdict | None) -> str:
    if v is None:
        return "-"
    return "; ".join(f"{c.strategy} {v.category.show(c.get(v.category.metric))}" for c in v.candidates)


def rows(verdicts: list[Verdict]) -> list[list[Any]]:
    """[group, fastest, tok/s of each, least memory, memory of each] per comparison group."""
    by_group: dict[str, dict[str, Verdict]] = {}
    for v in verdicts:
        by_group.setdefault(v.group, {})[v.category.name] = v
    out = []
    for group, cats in by_group.items():
        speed = cats.get(THROUGHPUT)
        memory = next((cats[m] for m in MEMORY if m in cats), None)
        if speed is None and memory is None:
            continue
        out.append([group, _pick(speed), _value(speed), _pick(memory),
                    (f"{memory.category.name.split(': ')[1]}: " + _value(memory)) if memory else "-"])
    return out


HEADER = ["comparison (same settings except strategy)", "fastest", "throughput", "least memory", "memory"]
