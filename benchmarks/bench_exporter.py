"""What the metrics exporter (trainer/exporter.py) costs a rank, outside the timed window.

Prints the median time of `after_step()` (a new snapshot of plain numbers, outside the step
timer: it adds to the loop's wall time between steps) and of a scrape over HTTP (the snapshot
rendered on the exporter's thread, client included: it runs beside the steps, takes no lock the
step needs, and competes only for the GIL and a core).

  .venv/bin/python benchmarks/bench_exporter.py
"""
from __future__ import annotations

import os
import statistics
import time
import types
import urllib.request

from shardbench.trainer import exporter
from shardbench.trainer.config import parse_args
from shardbench.trainer.record import ResultRecord


def median_us(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    cfg = parse_args(["--strategy", "ddp", "--metrics-port", "0", "--expected-tokens-per-s", "1000"])
    record = ResultRecord(run_id="bench-r0", strategy="ddp", world_size=2, tokens_per_step=512,
                          model={"preset": "tiny"}, precision="fp32", device="cpu")
    ex = exporter.start(cfg, record, 0)
    history = types.SimpleNamespace(step_times=[], restarts=0)
    trainer = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), ckpt=None, history=history)
    step = [0]

    def after_step():
        dt = 0.05 + step[0] * 1e-9
        history.step_times.append(dt)
        ex.after_step(trainer, step[0], dt, 9.0, True)
        step[0] += 1

    url = f"http://127.0.0.1:{ex.port}/metrics"
    size = len(urllib.request.urlopen(url).read())
    print(f"load average {os.getloadavg()[0]:.1f}")
    print(f"after_step (a new snapshot):          {median_us(after_step, 2000):8.1f} us (median)")
    print(f"a scrape over HTTP ({size} bytes):   {median_us(lambda: urllib.request.urlopen(url).read(), 200):8.1f} us "
          "(median, rendering and client included)")
    ex.close()


if __name__ == "__main__":
    main()
