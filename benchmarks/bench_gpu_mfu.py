"""MFU of the gpt2-124m preset at seq 2048 on one GPU (target >= 40% on an A100/H100).

Runs the trainer (ddp at world size 1 = the plain model; bf16 autocast, fused AdamW, SDPA flash
attention) with and without torch.compile and prints tokens/s and MFU from its records. The peak
comes from the trainer's device table (or --peak-tflops). Needs a CUDA GPU: says so and exits 1
without one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu_mfu: no CUDA GPU visible; run it on a GPU machine", file=sys.stderr)
        return 1
    p = argparse.ArgumentParser()
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--peak-tflops", type=float, default=None)
    a = p.parse_args()
    base = [sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--model", "gpt2-124m", "--seq-len", "2048",
            "--micro-batch", str(a.micro_batch), "--steps", str(a.steps), "--warmup-steps", "10",
            "--precision", "bf16", "--progress-every", "10"]
    if a.peak_tflops:
        base += ["--peak-tflops", str(a.peak_tflops)]
    print(f"device: {torch.cuda.get_device_name()}")
    for extra in ([], ["--compile"], ["--compile", "--activation-checkpointing"]):
        out = subprocess.run(base + extra, cwd=REPO, capture_output=True, text=True,
                             env=dict(os.environ, PYTHONWARNINGS="ignore")).stdout
        if "BENCHMARK_RESULT_JSON_START" not in out:
            print(f"{' '.join(extra) or 'eager'}: no record")
            continue
        r = json.loads(out.split("BENCHMARK_RESULT_JSON_START", 1)[1].split("BENCHMARK_RESULT_JSON_END", 1)[0])
        mfu = f"{r['mfu'] * 100:.1f}%" if r["mfu"] is not None else "unknown peak"
        print(f"{' '.join(extra) or 'eager':40s} status {r['status']:6s} {r['tokens_per_s'] or 0:>12,.0f} tok/s  "
              f"MFU {mfu}  peak mem {r['peak_memory_bytes'] / 2**30:.1f} GiB  ({r['peak_flops_source']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
