"""Predictions for many runs in a process of its own (the trace needs a fake process group,
which a process with another group cannot make): JSON on stdin, a list of {"key", "input"
(PlanInput fields), "device_memory_bytes", "links"}; JSON on stdout, {key: prediction,
{"input", "not_modelled": why} for a layout the planner has no model of, or {"error": why}}.

    echo '[{"key": "a", "input": {"strategy": "ddp"}}]' | python -m shardbench.trainer.plan.batch
"""
from __future__ import annotations

import json
import sys


def main() -> int:
    from shardbench.trainer.plan.inputs import PlanInput
    from shardbench.trainer.plan.planned_layout import NotModelled
    from shardbench.trainer.plan.predict import predict

    out = {}
    for job in json.load(sys.stdin):
        try:
            out[job["key"]] = predict(PlanInput(**job["input"]), job.get("device_memory_bytes"), job.get("links"))
        except NotModelled as exc:
            out[job["key"]] = {"input": job["input"], "not_modelled": str(exc)}
        except Exception as exc:  # noqa: BLE001 - one run's plan failing is that run's note, not the matrix's
            out[job["key"]] = {"error": f"{type(exc).__name__}: {exc}"}
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
