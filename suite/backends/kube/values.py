"""Pure helpers: a run's Helm release name and the chart values that make the release run it."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from shardbench.trainer.knobs import chart_keys, chart_run_values
from shardbench.suite.matrix.expand import RunSpec, values_dir


CHART_CHECKPOINT_KNOBS = chart_keys(under="checkpoint")
"""Trainer knobs the chart's checkpoint values carry (it passes them with --checkpoint-dir): their
`knob(chart_key="checkpoint.<key>")`, knob -> key."""


def release_name(run_id: str, suite: str = "") -> str:
    """A Helm release name for a run id: DNS-1123 label, at most 53 characters. `suite` (a
    suite's own tag) ends it, so two suites running the same configuration in one namespace
    never share (and uninstall) each other's release."""
    tail = f"-{suite}" if suite else ""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")[:53 - len(tail)].rstrip("-")
    return (name or "shardbench-run") + tail


def deep_merge(base: dict, override: dict) -> dict:
    """Merge two values trees; lists and scalars of `override` replace (Helm's own rule)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def run_overrides(spec: RunSpec) -> dict[str, Any]:
    """The chart values that make the release run exactly `spec` (what `--set run.x=...` would)."""
    # The first-class knobs as run.<camelCase> (trainer.knobs), every other one in extraArgs.
    run = {"id": spec.run_id, **chart_run_values(spec.run_config()), "globalBatch": None,
           "extraArgs": spec.option_args(skip=CHART_CHECKPOINT_KNOBS)}
    values = {"run": run, "launcher": spec.launcher, "workers": spec.nodes,
              "gpusPerWorker": spec.procs_per_node}
    options = dict(spec.extra_knobs)
    if spec.fault != "none" or options.get("checkpoint_every"):
        # Checkpoints live on the results volume (the chart gives the trainer --checkpoint-dir);
        # a faulty run's launcher is retried max_restarts times and resumes from the newest one.
        checkpoint = {"enabled": True}
        checkpoint.update({key: options[knob] for knob, key in CHART_CHECKPOINT_KNOBS.items() if options.get(knob)})
        values.update(checkpoint=checkpoint, persistence={"enabled": True})
        if spec.fault != "none":
            values["runPolicy"] = {"backoffLimit": spec.max_restarts}
    return values


def release_values(spec: RunSpec, directory: Path | None = None) -> dict[str, Any]:
    """values/<shape>.yaml (when the run names a shape that has one) overlaid by the run's values."""
    base: dict[str, Any] = {}
    if spec.shape:
        path = (directory or values_dir()) / f"{spec.shape}.yaml"
        if path.is_file():
            base = yaml.safe_load(path.read_text()) or {}
    return deep_merge(base, run_overrides(spec))
