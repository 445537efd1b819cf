"""The fault grammar of the matrix's `faults` axis, and which faults a run can take.

- `none`: a fault-free run;
- `kill-rank:R@S`: SIGKILL rank R once rank 0 reports optimizer step S (a node or process dies);
- `stop-rank:R@S`: SIGSTOP rank R at step S (a hang: the other ranks wait in a collective until
  the process-group timeout, --pg-timeout-s, ends them);
- `kill-launcher@S`: SIGKILL the launcher at step S (the job's driver dies; its ranks follow it,
  trainer/lifeline.py).
On a cluster (backend kubernetes, or ray with ray_cluster) only kill-rank is injected (KUBE_FAULT_KINDS). Pure: no
processes, no I/O.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

FAULT_KINDS = ("kill-rank", "stop-rank", "kill-launcher")
_FAULT = re.compile(r"^(?P<kind>kill-rank|stop-rank):(?P<rank>\d+)@(?P<step>\d+)$"
                    r"|^(?P<lkind>kill-launcher)@(?P<lstep>\d+)$")


@dataclass(frozen=True)
class Fault:
    kind: str
    """kill-rank, stop-rank or kill-launcher."""
    step: int
    """Injected once rank 0 has reported this optimizer step."""
    rank: int | None = None
    """The rank signalled (None for kill-launcher)."""

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}" if self.rank is None else f"{self.kind}:{self.rank}@{self.step}"


def parse_fault(text: Any) -> Fault | None:
    """`none` -> None; `kill-rank:1@12` -> Fault; anything else: ValueError with one line."""
    if text in (None, "none"):
        return None
    m = _FAULT.match(str(text)) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"fault {text!r} is not none, kill-rank:R@S, stop-rank:R@S or kill-launcher@S "
                         "(R a rank, S an optimizer step)")
    if m["lkind"]:
        return Fault(m["lkind"], int(m["lstep"]))
    return Fault(m["kind"], int(m["step"]), int(m["rank"]))


def fault_errors(text: Any, world_size: int, steps: int) -> list[str]:
    """Why `text` cannot be injected into a run of `world_size` ranks and `steps` steps."""
    try:
        fault = parse_fault(text)
    except ValueError as exc:
        return [str(exc)]
    if fault is None:
        return []
    errors = []
    if fault.rank is not None and fault.rank >= world_size:
        errors.append(f"fault {fault} names rank {fault.rank} but the run has {world_size} rank(s)")
    if not 1 <= fault.step < steps:
        errors.append(f"fault {fault} fires at step {fault.step}: use a step from 1 to {steps - 1}")
    return errors


KUBE_FAULT_KINDS = ("kill-rank",)
"""The faults injected on a cluster (MPIJob or RayJob); stop-rank and kill-launcher need the ranks' processes."""


def kube_fault_errors(text) -> list[str]:
    """Why fault `text` cannot be injected into a cluster run (one line), or []."""
    try:
        fault = parse_fault(text)
    except ValueError:
        return []  # the matrix's own fault check says what is wrong with it
    if fault is None or fault.kind in KUBE_FAULT_KINDS:
        return []
    return [f"fault {fault} cannot be injected on a cluster (kubernetes, or ray with ray_cluster: it deletes "
            "a worker pod): use kill-rank:R@S there, or a local backend"]
