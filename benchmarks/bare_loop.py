"""The baseline for bench_trainer.py: the same TinyGPT, optimizer, precision, batch, threads and
token generation in the plainest PyTorch loop there is (no strategy, no metrics, no progress
lines). Like the trainer, it times only the step: the next step's tokens are made after the
timer stops. Prints tokens/s."""
from __future__ import annotations

import argparse
import json
import time

import torch

from shardbench.trainer.data import SyntheticBatches
from shardbench.trainer.model import PRESETS, TinyGPT


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="tiny")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(1234)
    cfg = PRESETS[args.model]
    model = TinyGPT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device.type == "cuda")
    data = SyntheticBatches(1234, args.seq_len, cfg.vocab_size, args.micro_batch, 1, 0, 1)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    times = []
    batch = data.step_batches(0)
    for step in range(args.steps):
        t0 = time.perf_counter()
        (x, y), = batch
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= args.warmup_steps:
            times.append(time.perf_counter() - t0)
        batch = data.step_batches(step + 1)
    tokens = args.micro_batch * args.seq_len * len(times)
    print(json.dumps({"tokens_per_s": tokens / sum(times)}))


if __name__ == "__main__":
    main()
