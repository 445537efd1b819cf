"""What the metrics exporter (trainer/exporter.py) costs rank 0, outside the timed window.

Prints the median time of `after_step()` without a scrape since the last step (values only), with
one (values + a rendering), and the time the HTTP thread needs to answer a scrape (cached bytes).
None of these run inside the step timer; they add to the loop's wall time between steps.

  PYTHONPATH=. .venv/bin/python benchmarks/bench_exporter.py
"""
from __future__ import annotations

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
    trainer = types.SimpleNamespace(device=types.SimpleNamespace(type="cpu"), ckpt=None, restarts=0)
    step = [0]

    def quiet():
        ex._wanted = False
        ex.after_step(trainer, step[0], 0.05, 9.0, True)
        step[0] += 1

    def scraped():
        ex._wanted = True
        ex.after_step(trainer, step[0], 0.05, 9.0, True)
        step[0] += 1

    url = f"http://127.0.0.1:{ex.port}/metrics"
    size = len(urllib.request.urlopen(url).read())
    print(f"after_step, no scrape since the last step: {median_us(quiet, 2000):8.1f} us (median)")
    print(f"after_step, after a scrape (renders):      {median_us(scraped, 500):8.1f} us (median)")
    print(f"a scrape over HTTP (cached {size} bytes):  {median_us(lambda: urllib.request.urlopen(url).read(), 200):8.1f} us "
          "(median, client included)")
    ex.close()


if __name__ == "__main__":
    main()
