"""Trainer overhead: tokens/s of `python -m trainer` (world size 1, ddp = the plain model)
against benchmarks/bare_loop.py on the same model and batch, as a ratio (target >= 0.97).

Runs alternate trainer / bare / trainer / bare ... so drift on a shared machine hits both, and
compares medians. Usage: python benchmarks/bench_trainer.py [--model tiny] [--repeats 5]
(on a GPU it defaults to gpt2-124m at seq 1024, bf16).
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
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    shared = ["--model", a.model, "--seq-len", str(a.seq_len), "--micro-batch", str(a.micro_batch),
              "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps), "--precision", a.precision]
    trainer_cmd = [sys.executable, "-m", "trainer", "--strategy", "ddp", "--lr-warmup-steps", "1", *shared]
    bare_cmd = [sys.executable, str(REPO / "benchmarks" / "bare_loop.py"), *shared]
    trainer, bare = [], []
    for i in range(a.repeats):
        trainer.append(run(trainer_cmd))
        bare.append(run(bare_cmd))
        print(f"repeat {i + 1}/{a.repeats}: trainer {trainer[-1]:,.0f} tok/s  bare {bare[-1]:,.0f} tok/s", flush=True)
    t, b = statistics.median(trainer), statistics.median(bare)
    print(f"model {a.model} seq {a.seq_len} micro-batch {a.micro_batch} {a.precision} on {'cuda' if gpu else 'cpu'}")
    print(f"trainer median {t:,.0f} tok/s, bare loop median {b:,.0f} tok/s, ratio {t / b:.3f} (target >= 0.97)")


if __name__ == "__main__":
    main()
