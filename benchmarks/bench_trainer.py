"""Trainer overhead and CPU scaling, as ratios measured in the same run.

Overhead: tokens/s of `python -m shardbench.trainer` (world size 1, ddp = the plain model) against
benchmarks/bare_loop.py on the same model, batch, threads and per-rank token generation, as a
ratio (target >= 0.97). Runs alternate trainer / bare / trainer / bare ... so drift on a shared
machine hits both, and compares medians.

Scaling (--scaling): ddp at world size 1 (plain python) against world size 2 (torchrun), one
thread per rank, same global batch: efficiency = tok/s(2) / (2 x tok/s(1)). With one core per
rank it cannot exceed 1.0 by more than noise (1 rank vs 2 ranks is 1 core vs 2 cores).

Usage: python benchmarks/bench_trainer.py [--model tiny] [--repeats 5] [--scaling]
(on a GPU the overhead run defaults to gpt2-124m at seq 1024, bf16).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(cmd: list[str]) -> float:
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    if "BENCHMARK_RESULT_JSON_START" in out:
        body = out.split("BENCHMARK_RESULT_JSON_START", 1)[1].split("BENCHMARK_RESULT_JSON_END", 1)[0]
        return json.loads(body)["tokens_per_s"]
    return json.loads(out.strip().splitlines()[-1])["tokens_per_s"]


def load() -> str:
    return "load %.2f" % os.getloadavg()[0]


def overhead(a, shared: list[str], gpu: bool) -> None:
    trainer_cmd = [sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--lr-warmup-steps", "1",
                   "--threads-per-rank", str(a.threads), *shared]
    bare_cmd = [sys.executable, str(REPO / "benchmarks" / "bare_loop.py"), "--threads", str(a.threads), *shared]
    trainer, bare = [], []
    for i in range(a.repeats):
        trainer.append(run(trainer_cmd))
        bare.append(run(bare_cmd))
        print(f"repeat {i + 1}/{a.repeats}: trainer {trainer[-1]:,.0f} tok/s  bare {bare[-1]:,.0f} tok/s  ({load()})",
              flush=True)
    t, b = statistics.median(trainer), statistics.median(bare)
    print(f"model {a.model} seq {a.seq_len} micro-batch {a.micro_batch} {a.precision} on {'cuda' if gpu else 'cpu'}, "
          f"{a.threads} thread(s)")
    print(f"trainer median {t:,.0f} tok/s, bare loop median {b:,.0f} tok/s, ratio {t / b:.3f} (target >= 0.97)")


def scaling(a, shared: list[str]) -> None:
    base = [sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--lr-warmup-steps", "1", "--threads-per-rank", "1",
            "--global-batch", str(2 * a.micro_batch), *shared]
    one = [*base, "--micro-batch", str(2 * a.micro_batch)]
    two = ["torchrun", "--nproc-per-node", "2", "--master-port", "29531", "-m", "shardbench.trainer", *base[3:],
           "--micro-batch", str(a.micro_batch)]
    ws1, ws2 = [], []
    for i in range(a.repeats):
        ws1.append(run(one))
        ws2.append(run(two))
        print(f"repeat {i + 1}/{a.repeats}: ws1 {ws1[-1]:,.0f} tok/s  ws2 {ws2[-1]:,.0f} tok/s  "
              f"efficiency {ws2[-1] / (2 * ws1[-1]):.3f}  ({load()})", flush=True)
    t1, t2 = statistics.median(ws1), statistics.median(ws2)
    print(f"ddp {a.model} seq {a.seq_len} global batch {2 * a.micro_batch}, 1 thread per rank: ws1 median {t1:,.0f} "
          f"tok/s, ws2 median {t2:,.0f} tok/s, efficiency {t2 / (2 * t1):.3f} (expected <= 1.0)")


def main() -> None:
    import torch

    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="gpt2-124m" if gpu else "tiny")
    p.add_argument("--seq-len", type=int, default=1024 if gpu else 128)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--precision", default="bf16" if gpu else "fp32")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of both loops (the trainer's default is 1)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--scaling", action="store_true", help="ddp world size 2 vs 1 instead of the overhead ratio")
    a = p.parse_args()
    shared = ["--model", a.model, "--seq-len", str(a.seq_len), "--steps", str(a.steps),
              "--warmup-steps", str(a.warmup_steps), "--precision", a.precision]
    if a.scaling:
        scaling(a, shared)
    else:
        overhead(a, [*shared, "--micro-batch", str(a.micro_batch)], gpu)


if __name__ == "__main__":
    main()
