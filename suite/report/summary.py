"""The answer first: one row per comparison group saying which strategy, how fast, how much
memory (the top of BENCHMARK_REPORT.md; the method and the details follow it)."""
from __future__ import annotations

import re
from typing import Any

from shardbench.suite.analyze.verdicts import Verdict, host_note, pct

THROUGHPUT = "throughput"
MEMORY = ("memory: GPU training peak", "memory: model state per rank")


def answer(v: Verdict | None) -> str:
    """The answer of one category, exactly: 'ddp = fsdp; zero1/2 +25%, zero3 +90%' (equal values),
    'ddp ≈ fsdp (not separated); zero3 -20%' (timed, intervals not separated),
    '**zero3**; ddp/fsdp +60%' (a winner). Percentages are relative to the best."""
    if v is None:
        return "-"
    if v.kind == "flagged":
        return f"none named ({v.best.strategy} flagged)"
    if v.kind == "one repeat" or not v.tied:
        return "none named (one repeat): " + ", ".join(str(c.strategy) for c in v.candidates)
    if v.kind == "winner":
        top = f"**{v.best.strategy}**"
    elif v.kind == "equal":
        top = " = ".join(str(c.strategy) for c in v.tied)
    else:
        top = " ≈ ".join(str(c.strategy) for c in v.tied) + " (not separated)"
    rest = [c for c in v.candidates if c not in v.tied]
    return top + ("; " + others(v, rest) if rest else "")


def others(v: Verdict, rest: list[Any]) -> str:
    """'zero1/2 +25%, zero3 +90%': the rest by their difference from the best, equal ones merged."""
    by_pct: dict[str, list[str]] = {}
    for c in rest:
        by_pct.setdefault(pct(v.rel(c)), []).append(str(c.strategy))
    return ", ".join(f"{merge_names(names)} {p}" for p, names in by_pct.items())


def merge_names(names: list[str]) -> str:
    """['zero1', 'zero2'] -> 'zero1/2'; ['ddp', 'fsdp'] -> 'ddp/fsdp'."""
    out: list[str] = []
    prefix = None
    for name in names:
        m = re.fullmatch(r"(\D+)(\d+)", name)
        if m and prefix == m.group(1):
            out[-1] += "/" + m.group(2)
        else:
            out.append(name)
        prefix = m.group(1) if m else None
    return "/".join(out)


def _value(v: Verdict | None) -> str:
    if v is None:
        return "-"
    return "; ".join(f"{c.strategy} {v.category.show(c.get(v.category.metric))}{host_note(c, v.category, short=True)}"
                     for c in v.candidates)


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
        out.append([group, answer(speed), _value(speed), answer(memory),
                    (f"{memory.category.name.split(': ')[1]}: " + _value(memory)) if memory else "-"])
    return out


HEADER = ["which layout (same settings and devices)", "fastest", "throughput", "least memory", "memory"]


def text(verdicts: list[Verdict], where: str = "") -> str:
    """The Summary for a terminal: per comparison group the answer of each category, then its
    numbers (what `shardbench run` and `shardbench report` end with)."""
    groups = rows(verdicts)
    if not groups:
        return "Summary: fewer than two strategies finished ok in any comparison group: nothing to compare."
    lines = ["Summary (percentages relative to the best; 95% intervals"
             + (f"; full report: {where})" if where else ")")]
    for group, fastest, speed, least, memory in groups:
        lines.append(group)
        lines.append(f"  fastest:      {fastest.replace('**', '')}")
        lines.append(f"                {speed}")
        lines.append(f"  least memory: {least.replace('**', '')}")
        lines.append(f"                {memory}")
    return "\n".join(lines)
