"""`shardbench report` on 5,000 result records: wall time and peak RSS of the real CLI process.

Usage: python benchmarks/bench_report_5k.py [--records 5000] [--shape repeats|configs] [--steps 100]
Records are written as <results>/<run-id>/result.json (tests/synthetic.py, the same made-up
but schema-valid records the tests use), then `python -m shardbench.suite.cli report` runs on them in a
child process; its peak RSS is the child's ru_maxrss (getrusage RUSAGE_CHILDREN), its time the
wall clock around it. Shapes: `repeats` = 20 configurations x 250 repeats; `configs` = 1,000
configurations (seq len x micro-batch x strategy x world size) x 5 repeats, the harder case for
the per-configuration tables and plots. Every ok record carries a planner prediction, as records of
`shardbench run` do (the real planner, run once per strategy x world size before the timing; its
"Plan vs measurement" section was quadratic in the records). `--records 20000` for the larger set.
Goal (issue 35): 5,000 records under 10 s and 300 MB on this machine.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import synthetic  # noqa: E402


def many_configs(n: int, steps: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out, strategies, worlds = [], ["ddp", "fsdp", "zero1", "zero2", "zero3"], [1, 2, 4, 8]
    seq_lens = [32 * (i + 1) for i in range(25)]
    i = 0
    while len(out) < n:
        config, rep = i // 5, i % 5
        strategy, world = strategies[config % 5], worlds[(config // 5) % 4]
        seq, mb = seq_lens[(config // 20) % 25], 1 + (config // 500)
        tps = 1000.0 * world * rng.uniform(0.85, 1.15)
        rec = synthetic.record(strategy, world, tps, seq_len=seq, micro_batch=mb, repeat=rep,
                               status="failed" if rng.random() < 0.05 else "ok", usd_per_gpu_hour=2.0)
        rec["loss_per_step"] = [9.0 - 0.01 * s for s in range(steps)]
        rec["step_time_s"]["all"] = [rec["step_time_s"]["mean"]] * max(1, steps - 10)
        rec["steps"], rec["warmup_steps"], rec["measured_steps"] = steps, 10, max(1, steps - 10)
        out.append(rec)
        i += 1
    return out


USAGE = "REPORT_USAGE "
WRAP = ("import json, resource, sys\nfrom shardbench.suite.cli.commands import main\ncode = main(sys.argv[1:])\n"
        "u = resource.getrusage(resource.RUSAGE_SELF)\n"
        f"print({USAGE!r} + json.dumps({{'rss_kb': u.ru_maxrss, 'cpu': u.ru_utime + u.ru_stime}}), file=sys.stderr)\n"
        "sys.exit(code)")


def predictions() -> dict[tuple[str, int], dict]:
    """The planner's prediction per (strategy, world size) of the tiny model at seq len 32."""
    from shardbench.suite.matrix.expand import MatrixSpec, expand
    from shardbench.suite.matrix.planning import predict_specs

    specs, _ = expand(MatrixSpec(strategies=["ddp", "fsdp", "zero1", "zero2", "zero3"], world_sizes=[1, 2, 4, 8],
                                 seq_lens=[32], repeats=1, shape=None, device="cpu", precision="fp32"))
    found, why = predict_specs(specs)
    if why:
        raise SystemExit(f"planner: {why}")
    return {(s.strategy, s.world_size): found[s.run_id] for s in specs if s.run_id in found}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=5000)
    p.add_argument("--shape", choices=["repeats", "configs"], default="configs")
    p.add_argument("--steps", type=int, default=100, help="steps per record (configs shape)")
    p.add_argument("--no-plan", action="store_true", help="records without predictions")
    args = p.parse_args()
    records = synthetic.records(args.records) if args.shape == "repeats" else many_configs(args.records, args.steps)
    plans = {} if args.no_plan else predictions()
    for rec in records:
        if rec.get("status") == "ok" and (rec["strategy"], rec["world_size"]) in plans:
            rec["prediction"] = plans[(rec["strategy"], rec["world_size"])]
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results"
        for rec in records:
            d = results / rec["run_id"]
            d.mkdir(parents=True, exist_ok=True)
            (d / "result.json").write_text(json.dumps(rec))
        size = sum(p.stat().st_size for p in results.glob("*/result.json"))
        env = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
        t0 = time.monotonic()
        # The report's own peak RSS and CPU, read inside its process: RUSAGE_CHILDREN would also
        # hold the planner's subprocess (torch) that made the predictions.
        proc = subprocess.run([sys.executable, "-c", WRAP, "report", str(results), "--out", str(Path(tmp) / "report")],
                              cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.monotonic() - t0
        usage = json.loads(proc.stderr.rsplit(USAGE, 1)[1]) if USAGE in proc.stderr else {"rss_kb": 0, "cpu": 0}
        peak_mb, cpu = usage["rss_kb"] / 1024, usage["cpu"]
        print(f"report ({args.shape}): {len(records)} records ({size / 1e6:.1f} MB of result.json), "
              f"wall {wall:.1f} s, CPU {cpu:.1f} s (user+sys; wall depends on the machine's load: "
              f"load average {os.getloadavg()[0]:.1f}), peak RSS {peak_mb:.0f} MB, exit {proc.returncode}")
        if proc.returncode != 0:
            print(proc.stderr[-3000:])


if __name__ == "__main__":
    main()
