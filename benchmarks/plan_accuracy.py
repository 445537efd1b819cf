"""The planner's predicted-vs-measured table over the records benchmarks/plan_measure.py wrote:
model state (2% target), total tensor peak (10%), collective bytes per op (1%), and step time at
world size 2 predicted from the same strategy's world-size-1 run (25%, a benchmark: CPU timing on
a shared machine is noisy).

    PYTHONPATH=$PWD nice .venv/bin/python benchmarks/plan_accuracy.py /tmp/plan-runs
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from shardbench.trainer.plan.accuracy import errors
from shardbench.trainer.plan.inputs import PlanInput
from shardbench.trainer.plan.predict import predict
from shardbench.suite.cli.plan_cmd import shape_context


def main(directory: Path) -> None:
    records = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}
    _, _, links = shape_context("cpu")
    print("| run | model state | tensor peak | comm bytes (worst op) | step time (w2 from w1) |")
    print("| --- | --- | --- | --- | --- |")
    worst = {"state": 0.0, "peak": 0.0, "comm": 0.0}
    for name, r in records.items():
        cal = None
        if r["world_size"] == 2:
            base = records.get(name.replace("-w2-", "-w1-"))
            if base and base.get("tokens_per_s"):
                cal = {"achieved_flops": base["tokens_per_s"] * base["flops_per_token"], "source": "w1"}
        p = predict(PlanInput.from_record(r), links=links, calibration=cal)
        e = errors(p, r)
        for k in worst:
            if e.get(k) is not None:
                worst[k] = max(worst[k], abs(e[k]))
        step = f"{e['step']:+.1%}" if cal and e.get("step") is not None else ""
        comm = f"{e['comm']:+.2%}" if e.get("comm") is not None else "none"
        print(f"| {name} | {e['state']:+.2%} | {e['peak']:+.2%} | {comm} | {step} |")
    print(f"\nworst |error|: model state {worst['state']:.2%}, tensor peak {worst['peak']:.2%}, "
          f"comm bytes {worst['comm']:.2%} over {len(records)} runs")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
