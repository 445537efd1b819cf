"""The planner against real runs of randomly drawn configurations (CPU, gloo): a seeded matrix much
wider than the tests (model dimensions, sequence length, micro-batch, grad-accum, precision,
activation checkpointing, bucket size, gradient-reduce dtype, FSDP's sync and reshard modes,
ZeRO-3's reshard mode, models larger than a bucket, 1-4 ranks), each run as a tiny real trainer
run and compared with its prediction: model state (target 2%), tensor peak (10%), collective bytes
per op (1%, the ops carrying >= 1% of a step's bytes) and calls per op (exact). Prints every run
and, per strategy and category, the worst and median |error|. A benchmark, not a test.

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/plan_accuracy_random.py /tmp/plan-random --n 36 --seed 31

Records are kept under OUT/<name>.json; a rerun re-measures only what is missing or older than
the last commit of the strategy code it ran (the matrix can be resumed),
then predicts every record afresh, so planner changes need no re-measurement.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from pathlib import Path

from shardbench.trainer.contract import STRATEGIES

REPO = Path(__file__).resolve().parents[1]
CODE = ["trainer/model.py"]
ENGINE_CODE = {"ddp": ["trainer/strategies/ddp.py"], "fsdp": ["trainer/strategies/fsdp.py"],
               "deepspeed": ["trainer/strategies/zero.py", "trainer/ds_configs", "trainer/ds_knobs.py"]}
"""What a measurement depends on (all, and per engine): a record older than the last commit of
its code is measured again (and left out of a --report-only table)."""
CATEGORIES = ("state", "peak", "comm")


NO_BEHAVIOUR = {"b39a6fb"}
"""Commits to that code checked to change no behaviour (b39a6fb: type annotations and ignores)."""


def code_time(strategy: str) -> float:
    """When the code a run of `strategy` measures last changed (its last commit that changed
    behaviour)."""
    paths = CODE + ENGINE_CODE.get(STRATEGIES[strategy].engine, [])
    log = subprocess.run(["git", "log", "--format=%h %ct", "--", *paths], cwd=REPO, capture_output=True,
                         text=True).stdout.split()
    times = [float(t) for h, t in zip(log[::2], log[1::2]) if h[:7] not in NO_BEHAVIOUR]
    return max(times, default=0.0)


def current(path: Path, strategy: str) -> bool:
    return path.exists() and path.stat().st_mtime >= code_time(strategy)


def draw(rng: random.Random, i: int) -> tuple[str, str, int, list[str]]:
    """One configuration: (name, strategy, world size, trainer flags)."""
    from shardbench.trainer.plan.planned_layout import unmodelled

    strategies = [s for s, info in STRATEGIES.items() if unmodelled(info) is None]
    strategy = strategies[i % len(strategies)]
    world = rng.choice([1, 2, 2, 3, 4])
    n_head = rng.choice([2, 4])
    n_embd = n_head * rng.choice([16, 24, 32, 48])
    args = ["--strategy", strategy, "--model", "tiny", "--n-layer", str(rng.randint(1, 4)), "--n-embd", str(n_embd),
            "--n-head", str(n_head), "--vocab-size", str(rng.choice([512, 2048, 8192, 16384])),
            "--seq-len", str(rng.choice([16, 32, 64, 128])), "--micro-batch", str(rng.randint(1, 4)),
            "--grad-accum", str(rng.choice([1, 1, 2, 3])), "--precision", rng.choice(["fp32", "bf16"]),
            # 0.5 and 2 MiB: most drawn models are larger than one bucket
            "--bucket-mib", str(rng.choice([0.5, 2, 25])),
            "--grad-reduce-dtype", rng.choice(["fp32", "fp32", "bf16"]),
            "--activation-checkpointing" if rng.random() < 0.3 else "--no-activation-checkpointing",
            "--fsdp-grad-sync", rng.choice(["every_micro_step", "last_micro_step"]),
            "--reshard-after-forward" if rng.random() < 0.6 else "--no-reshard-after-forward",
            "--steps", "2", "--warmup-steps", "1", "--device", "cpu", "--seed", "7"]
    return f"{i:02d}-{strategy}-w{world}", strategy, world, args


def measure(out: Path, n: int, seed: int) -> None:
    from tests.trainer.conftest import run_trainer

    (out / "run").mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for i in range(n):
        name, strategy, world, args = draw(rng, i)
        path = out / f"{name}.json"
        if current(path, strategy):
            continue
        run = run_trainer(args, out / "run", launcher="mpirun" if world > 1 else None, nproc=world, timeout=600)
        if run.returncode != 0:
            print(name, "FAILED", " ".join(args), run.stderr[-400:], flush=True, file=sys.stderr)
            continue
        path.write_text(json.dumps({**run.record, "bench_args": args}))
        print(name, "measured", flush=True, file=sys.stderr)


def calls_exact(prediction: dict, record: dict) -> bool:
    """Calls per op equal for every predicted op and every measured op carrying >= 1% of the
    step's bytes (ZeRO-3's early steps add a few broadcasts of a few hundred bytes, unmodelled)."""
    predicted = {op: v["calls"] for op, v in (prediction.get("comm_per_step") or {}).items() if v["calls"]}
    measured = record.get("comm_per_step") or {}
    total = sum(v["bytes"] for v in measured.values())
    return predicted == {op: v["calls"] for op, v in measured.items() if op in predicted or v["bytes"] >= 0.01 * total}


def _knobs(r: dict) -> str:
    args = r.get("bench_args") or []
    pick = {a: args[i + 1] for i, a in enumerate(args[:-1])
            if a in ("--n-layer", "--n-embd", "--vocab-size", "--seq-len", "--micro-batch", "--grad-accum",
                     "--precision", "--bucket-mib", "--grad-reduce-dtype", "--fsdp-grad-sync")}
    flags = [a[2:] for a in args if a in ("--activation-checkpointing", "--no-reshard-after-forward")]
    return (f"L{pick.get('--n-layer')} d{pick.get('--n-embd')} V{pick.get('--vocab-size')} T{pick.get('--seq-len')} "
            f"mb{pick.get('--micro-batch')} ga{pick.get('--grad-accum')} {pick.get('--precision')} "
            f"bucket {pick.get('--bucket-mib')} reduce {pick.get('--grad-reduce-dtype')}"
            + (f" {pick.get('--fsdp-grad-sync')}" if r.get("strategy") == "fsdp" else "")
            + "".join(f" {f}" for f in flags if f != "no-reshard-after-forward"
                      or r.get("strategy") in ("fsdp", "zero3")))  # where it applies


def report(out: Path) -> None:
    from shardbench.trainer.plan.accuracy import errors
    from shardbench.trainer.plan.inputs import Params, PlanInput
    from shardbench.trainer.plan.predict import predict

    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    stale = sorted(n for n, r in records.items() if not current(out / f"{n}.json", r["strategy"]))
    records = {n: r for n, r in records.items() if n not in stale}
    per: dict[str, dict[str, list[float]]] = {}
    exact: dict[str, list[bool]] = {}
    print("| run | configuration | params | state | peak | comm bytes (worst op) | calls per op |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in records.items():
        inp = PlanInput.from_record(r)
        p = predict(inp)
        e = errors(p, r)
        ok = calls_exact(p, r)
        s = r["strategy"]
        for k in CATEGORIES:
            if e.get(k) is not None:
                per.setdefault(s, {}).setdefault(k, []).append(abs(e[k]))
        exact.setdefault(s, []).append(ok)
        comm = f"{e['comm']:+.2%}" if e.get("comm") is not None else "none"
        print(f"| {name} | {_knobs(r)} | {Params.of(inp.model_config()).total / 1e6:.2f}M | {e['state']:+.2%} | "
              f"{e['peak']:+.2%} | {comm} | {'exact' if ok else 'DIFFER'} |")
    print("\n| strategy | runs | model state worst / median | tensor peak worst / median | "
          "comm bytes worst / median | calls per op exact |")
    print("| --- | --- | --- | --- | --- | --- |")
    for s in sorted(per, key=list(STRATEGIES).index):
        cells = []
        for k in CATEGORIES:
            v = per[s].get(k) or []
            cells.append(f"{max(v):.2%} / {statistics.median(v):.2%}" if v else "-")
        print(f"| {s} | {len(exact[s])} | " + " | ".join(cells) + f" | {sum(exact[s])}/{len(exact[s])} |")
    if stale:
        print(f"\nleft out, measured by other strategy code than today's (run without --report-only to "
              f"measure them again): {', '.join(stale)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--n", type=int, default=36, help="configurations to draw (default 36)")
    ap.add_argument("--seed", type=int, default=31)
    ap.add_argument("--report-only", action="store_true", help="predict the records already measured")
    a = ap.parse_args()
    if not a.report_only:
        measure(a.out, a.n, a.seed)
    report(a.out)


if __name__ == "__main__":
    main()
