"""The fault-tolerance table: what checkpointing and recovery cost each strategy and world size.

Per (strategy, world size), from the runs that checkpointed (and the fault runs among them):
checkpoint size, save cost per checkpoint and as % of the training time between checkpoints at
the interval the runs used, recovery time (fault to the first step after resume), steps lost,
and goodput under an assumed failure rate, at the interval used and at the interval Young's
formula gives from the measured save cost.

Model (Young 1974, first order; Daly 2006 for the restart term): with a checkpoint that stalls
training C seconds every tau seconds of training, failures arriving every M seconds on average,
and R seconds from a failure to training again, the share of wall time lost is
    C / tau + (tau / 2 + R) / M
(the save itself; on average half an interval of work redone; the restart), so
    goodput = tokens/s x (1 - C / tau - (tau / 2 + R) / M),
which is largest at tau = sqrt(2 C M) (Young's interval).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean
from typing import Any

DEVICE_MTBF_HOURS = 50_000.0
"""Assumed mean time between failures of one device, hours: Llama 3's pre-training saw 419
unexpected interruptions in 54 days on 16,384 GPUs (Dubey et al. 2024, section 3.3.4), one per
~50,700 GPU-hours. A job of N devices fails N times as often."""


@dataclass
class FaultRow:
    strategy: str
    world_size: int
    runs: int
    fault_runs: int
    size_bytes: float | None
    """Whole checkpoint, bytes (all ranks)."""
    size_bytes_per_rank: float | None
    """Largest rank's share, bytes."""
    save_s: float | None
    """Seconds training stood still per checkpoint (the whole save when synchronous)."""
    step_s: float | None
    """Mean step time, seconds (checkpoint steps excluded)."""
    every: int | None
    """Steps between checkpoints the runs used."""
    save_pct: float | None
    """save_s as % of the training time between two checkpoints at `every`."""
    recovery_s: float | None
    """Fault to the first step after resume, less the launcher's own wait once a rank reported the
    fault (the record's fault.recovery_s), seconds (fault runs)."""
    steps_lost: float | None
    """Steps redone per failure (fault runs)."""
    mtbf_s: float
    """Assumed mean time between failures of the whole job, seconds."""
    goodput_pct: float | None
    """Useful share of wall time at the interval used, under the assumed failure rate."""
    young_every: int | None
    """Young's interval, in steps: sqrt(2 x save_s x MTBF) / step time."""
    young_goodput_pct: float | None


def _avg(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return mean(values) if values else None


def goodput_share(save_s: float, tau_s: float, recovery_s: float, mtbf_s: float) -> float:
    """Share of wall time that trains usefully (module docstring), clipped at 0."""
    return max(0.0, 1.0 - save_s / tau_s - (tau_s / 2 + recovery_s) / mtbf_s)


def young_interval_s(save_s: float, mtbf_s: float) -> float:
    return math.sqrt(2.0 * save_s * mtbf_s)


def rows(records: list[dict[str, Any]], device_mtbf_hours: float = DEVICE_MTBF_HOURS) -> list[FaultRow]:
    """One row per (strategy, world size) among the ok runs that checkpointed."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        if r.get("status") == "ok" and (r.get("checkpoint") or {}).get("every"):
            groups.setdefault((r["strategy"], r["world_size"]), []).append(r)
    out = []
    for (strategy, world), runs in sorted(groups.items()):
        ck = [r["checkpoint"] for r in runs]
        faults = [r["fault"] for r in runs if r.get("fault")]
        save_s = _avg(c.get("blocking_s_mean") for c in ck)
        step_s = _avg((r.get("step_time_s") or {}).get("mean") for r in runs)
        every = round(_avg(c["every"] for c in ck))  # type: ignore[arg-type]
        recovery = _avg(f.get("recovery_s") for f in faults)
        mtbf_s = device_mtbf_hours * 3600.0 / world
        row = FaultRow(strategy, world, len(runs), len(faults), _avg(c.get("size_bytes") for c in ck),
                       _avg(max(c.get("size_bytes_per_rank") or [0]) for c in ck), save_s, step_s, every,
                       None, recovery, _avg(f.get("steps_redone") for f in faults), mtbf_s, None, None, None)
        if save_s is not None and step_s:
            tau = every * step_s
            row.save_pct = 100.0 * save_s / tau
            if recovery is not None:
                row.goodput_pct = 100.0 * goodput_share(save_s, tau, recovery, mtbf_s)
                young = young_interval_s(save_s, mtbf_s)
                row.young_every = max(1, round(young / step_s))
                row.young_goodput_pct = 100.0 * goodput_share(save_s, row.young_every * step_s, recovery, mtbf_s)
        out.append(row)
    return out


def _f(x: Any, spec: str = "{:.3g}") -> str:
    return "-" if x is None else spec.format(x)


def _mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.1f}"


def table_rows(found: list[FaultRow]) -> list[list[str]]:
    """The table's cells (the report and benchtui show the same)."""
    return [[r.strategy, str(r.world_size), f"{r.runs} ({r.fault_runs})", _mb(r.size_bytes), _mb(r.size_bytes_per_rank),
             _f(r.save_s), _f(r.every, "{:d}"), _f(r.save_pct, "{:.2f}"), _f(r.recovery_s), _f(r.steps_lost, "{:.1f}"),
             _f(r.goodput_pct, "{:.3f}"), _f(r.young_every, "{:,d}"), _f(r.young_goodput_pct, "{:.3f}")]
            for r in found]


HEADER = ["strategy", "devices", "runs (faulty)", "checkpoint MB", "MB/rank (max)", "save s", "every (steps)",
          "save % of interval", "recovery s", "steps lost", "goodput % at every", "Young's every (steps)",
          "goodput % at Young's"]


def text_lines(records: list[dict[str, Any]], device_mtbf_hours: float = DEVICE_MTBF_HOURS) -> list[str]:
    """The same table as aligned plain text (benchtui's Results screen); [] when no run checkpointed."""
    cells = table_rows(rows(records, device_mtbf_hours))
    if not cells:
        return []
    widths = [max(len(row[i]) for row in [HEADER, *cells]) for i in range(len(HEADER))]
    line = lambda row: "  ".join(c.rjust(w) for c, w in zip(row, widths))  # noqa: E731
    return [line(HEADER), *map(line, cells),
            f"goodput: one failure per {device_mtbf_hours:,.0f} device-hours assumed; Young's interval sqrt(2 C MTBF)"]


def markdown(records: list[dict[str, Any]], device_mtbf_hours: float = DEVICE_MTBF_HOURS) -> str:
    """The report's section ('' when no run checkpointed)."""
    found = rows(records, device_mtbf_hours)
    if not found:
        return ""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(found)]
    return "\n".join([
        "## Fault tolerance",
        "",
        f"Runs that checkpointed (ok runs; fault runs were killed or hung once and relaunched from their "
        f"checkpoint). Save s: seconds training stood still per checkpoint. Recovery: from the fault to "
        f"the first step after resume, less the launcher's own wait after a rank reported the fault. "
        f"Goodput assumes one failure per {device_mtbf_hours:,.0f} "
        f"device-hours (Llama 3's 419 interruptions in 54 days on 16,384 GPUs), i.e. a job MTBF of that "
        f"divided by its devices, and is 1 - C/tau - (tau/2 + R)/MTBF (C save s, tau the training time "
        f"between checkpoints, R recovery s); Young's interval sqrt(2 C MTBF) maximises it. "
        f"Goodput needs a fault run for R.",
        "",
        *lines,
    ]) + "\n"
