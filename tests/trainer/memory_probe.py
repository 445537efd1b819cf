"""Run under torchrun (or alone): the trainer's memory step beside the CPU allocator's own event
stream (torch.profiler, profile_memory, started before the model is built). Each rank prints one
JSON line, bytes:
- `instrument_rise` / `allocator_rise`: the peak within the memory step above the level at its
  start, by the live-tensor instrument (trainer/plan/live.py) and by the allocator's running sum;
- `instrument_start` / `allocator_start`: those levels; `missed_free_bytes`: allocations the
  allocator shows live at the start although it later handed their address out again with no free
  in between (a free on a thread the profiler does not record, e.g. a gloo work thread), and
  `unexplained_bytes`: what the allocator shows live at the start beyond the instrument and those.
Used by tests/trainer/test_memory_allocator.py."""
from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from shardbench.trainer.config import parse_args
from shardbench.trainer.dist_env import detect
from shardbench.trainer.train import Trainer


def memory_events(prof) -> tuple[list[dict], dict]:
    """The allocator's events (args: Addr, Bytes; frees negative) in time order, and the mark."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)["traceEvents"]
    mark = next(e for e in trace if e.get("name") == "memory_step")
    events = sorted((e for e in trace if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
                    key=lambda e: e["ts"])
    return events, mark


def replay(events: list[dict], start: float, end: float) -> dict:
    live: dict[int, int] = {}
    start_live: dict[int, int] = {}
    missed: set[int] = set()
    total = at_start = peak = 0
    started = False
    for e in events:
        if e["ts"] >= start and not started:
            started, at_start, peak = True, total, total
            start_live = dict(live)
        addr, n = e["args"]["Addr"], e["args"]["Bytes"]
        if n > 0:
            if addr in live:  # handed out again: its free was not recorded
                total -= live[addr]
                missed.add(addr)
            live[addr] = n
        else:
            live.pop(addr, None)
        total += n
        if start <= e["ts"] <= end:
            peak = max(peak, total)
    return {"at_start": at_start, "peak": peak,
            "missed_at_start": sum(n for a, n in start_live.items() if a in missed)}


def main() -> None:
    t = Trainer(parse_args([*sys.argv[1:], "--device", "cpu"]), detect(dict(os.environ)))
    t.init_process_group()
    # (profile_all_threads=True would follow gloo's threads, but then torch 2.13 records no memory events)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        t.build()
        for step in range(2):  # steady state: optimizer state and DeepSpeed's trace exist
            t.steps.step(t.data.step_batches(step))
        batches = t.data.step_batches(2)
        with record_function("memory_step"):
            t.steps.memory_step(batches)
    events, mark = memory_events(prof)
    r = replay(events, mark["ts"], mark["ts"] + mark["dur"])
    start = t.steps.tensor_start
    line = json.dumps({"rank": t.dist.rank, "instrument_rise": t.steps.tensor_peak - start,
                       "allocator_rise": r["peak"] - r["at_start"], "instrument_start": start,
                       "allocator_start": r["at_start"], "missed_free_bytes": r["missed_at_start"],
                       "unexplained_bytes": r["at_start"] - r["missed_at_start"] - start})
    # One write(2) of the whole line: both ranks share torchrun's stdout pipe, and a line under
    # PIPE_BUF written at once is never interleaved with the other rank's (seen in CI: two ranks'
    # objects on one line).
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())
    if t.distributed:
        torch.distributed.barrier()


if __name__ == "__main__":
    main()
