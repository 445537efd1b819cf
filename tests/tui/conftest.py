"""Shared helpers for the TUI tests: synthetic records, rank-process checks, app factory."""
from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from shardbench.trainer.record import ResultRecord, StepTimes, write_atomic

FIXTURES = Path(__file__).parent / "fixtures"
FIXED_AVAILABILITY = {"local": (True, ""),
                      "kubernetes": (False, "no kubeconfig: set KUBECONFIG or create ~/.kube/config"),
                      "ray": (True, "")}


@pytest.fixture
def fixture_values(monkeypatch):
    """values/ replaced by the test's own shapes (cpu, h100), so screens do not drift with values/."""
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(FIXTURES / "values"))


def synthetic_record(strategy: str, world: int, tokens_per_s: float, memory_gib: float,
                     status: str = "ok", error: str | None = None) -> dict:
    """A record as the trainer writes it, with chosen numbers (snapshot and table tests)."""
    rec = ResultRecord(run_id=f"{strategy}-w{world}-s64-mb4-ga1-r0", status=status, error=error,
                       strategy=strategy, launcher="mpirun", world_size=world, model={"preset": "tiny"},
                       precision="fp32", seq_len=64, micro_batch=4, grad_accum=1, global_batch=4 * world,
                       tokens_per_step=256 * world, steps=5, warmup_steps=2, measured_steps=3,
                       gpu_shape="cpu")
    if status == "ok":
        rec.tokens_per_s = tokens_per_s
        rec.tokens_per_s_per_device = tokens_per_s / world
        rec.step_time_s = StepTimes(mean=256 * world / tokens_per_s, p50=256 * world / tokens_per_s)
        rec.peak_memory_bytes = int(memory_gib * 1024 ** 3)
        rec.model_state_bytes_per_rank = int(0.04 * 1024 ** 3 / (world if strategy != "ddp" else 1))
    return rec.to_dict()


def write_results(directory: Path, records: list[dict]) -> Path:
    for rec in records:
        write_atomic(rec, str(directory / rec["run_id"] / "result.json"))
    return directory


def rank_processes(marker: str) -> list[str]:
    """Live (non-zombie) processes whose command line mentions `marker` (a results dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(proc.info["cmdline"] or [])
        except (psutil.Error, TypeError):
            continue
        if marker in cmd:
            found.append(f"{proc.pid}: {cmd[:160]}")
    return found


async def settle(pilot, timeout: float = 60.0) -> None:
    """Wait until the app's workers are done. Not workers.wait_for_complete(): that raises when
    an exclusive worker (results refresh) was superseded by a newer one, which is normal here."""
    import time

    until = time.monotonic() + timeout
    while any(not w.is_finished for w in pilot.app.workers) and time.monotonic() < until:
        await pilot.pause(0.1)
    await pilot.pause()
