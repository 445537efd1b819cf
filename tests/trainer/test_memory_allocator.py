"""Issue 31, finding 7: the measured CPU tensor peak (the live-tensor instrument that also makes
the planner's prediction) checked against an independent count, the CPU allocator's own event
stream (torch.profiler's memory events, tests/trainer/memory_probe.py), on real 2-rank runs.

The +4.9% an allocator count once showed on one fsdp rank (8,520,704 B: the root unit's gathered
wte + wpe + ln_f in fp32) was a free the event stream never recorded, not memory the instrument
missed: that buffer's last reference is dropped on a thread the profiler does not follow (which
rank, varies run to run), and the allocator later hands the same address out again with no free
in between (`missed_free_bytes`). Such a stream is incomplete for the whole window, so the check
is made on the ranks whose stream shows no sign of a missed free (fsdp here: one rank of the two
lost a free in 4 of 6 runs, never both; zero3: none seen); torch 2.13's `profile_all_threads` would follow gloo's
threads but then records no memory events at all."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import REPO, cpu_env, free_port

pytestmark = pytest.mark.slow  # real 2-rank runs under the profiler


def _ranks(strategy: str) -> list[dict]:
    probe = Path(__file__).with_name("memory_probe.py")
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(probe), "--strategy", strategy, "--model", "tiny",
           "--seq-len", "64", "--micro-batch", "2", "--steps", "3", "--warmup-steps", "1", "--precision", "fp32"]
    proc = subprocess.run(cmd, cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = _rank_objects(proc.stdout)
    assert len(ranks) == 2
    return ranks


def _rank_objects(text: str) -> list[dict]:
    """Every `{"rank": ...}` object in the output, wherever a line holds it (a launcher may prefix
    or join lines)."""
    decoder, found, at = json.JSONDecoder(), [], text.find('{"rank"')
    while at >= 0:
        obj, end = decoder.raw_decode(text, at)
        found.append(obj)
        at = text.find('{"rank"', end)
    return found


def _complete(ranks: list[dict]) -> list[dict]:
    complete = []
    for r in ranks:
        peak = r["instrument_start"] + r["instrument_rise"]
        # The allocator never shows less than the instrument at the start: no tensor counted twice.
        assert r["allocator_start"] >= r["instrument_start"] - 1e-3 * peak, r
        if r["missed_free_bytes"] == 0 and abs(r["allocator_start"] - r["instrument_start"]) <= 1e-3 * peak:
            complete.append(r)  # a stream with no sign of a missed free (see the module docstring)
    return complete


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_the_tensor_peak_agrees_with_the_cpu_allocator(strategy):
    # The profiler drops frees made on gloo's threads (module docstring); under load that can hit
    # both ranks of a run, leaving nothing to compare: one more run, then a visible skip, never a pass.
    for _ in range(2):
        ranks = _ranks(strategy)
        complete = _complete(ranks)
        if complete:
            break
    else:
        pytest.skip(f"the profiler lost frees on every rank of two runs: nothing to compare ({ranks})")
    # The instrument never counts more than the allocator hands out (a tensor counted twice, or one
    # never allocated, would show here on any rank). A free the profiler lost inflates only the
    # allocator's side, and is found only when its address is handed out again: a loaded CI run
    # showed a zero3 rank 793,088 B (2%) above with no such sign. So the step's peak above its
    # start must agree to the byte (within 0.1%) on at least one complete rank, and on none may the
    # instrument be above.
    for r in complete:
        assert r["instrument_rise"] <= r["allocator_rise"] * (1 + 1e-3), r
    assert any(r["instrument_rise"] == pytest.approx(r["allocator_rise"], rel=1e-3) for r in complete), complete
