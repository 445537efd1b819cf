"""The matrix's plans (torch-free): every run's prediction before launch, made by
trainer/plan in one subprocess, and the fit check (warn, or refuse with --strict, runs predicted
over their device's memory)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from shardbench.suite.matrix import plan_cache
from shardbench.trainer.plan.inputs import PlanInput

REPO = Path(__file__).resolve().parents[2]


def plan_input(spec) -> PlanInput:
    """A run spec as the planner's input (auto device and precision resolved as the trainer
    does: a shape with GPUs means cuda and bf16, else cpu and fp32)."""
    device, precision = resolved_device(spec.config)
    return PlanInput.of(spec.config, world_size=spec.world_size, seq_len=spec.seq_len, grad_accum=spec.grad_accum,
                        precision=precision, device=device)


def resolved_device(cfg) -> tuple[str, str]:
    """(device, precision) of a RunConfig with `auto` resolved as the trainer does."""
    device = cfg.device if cfg.device != "auto" else ("cuda" if cfg.peak_tflops else "cpu")
    precision = cfg.precision if cfg.precision != "auto" else ("bf16" if device == "cuda" else "fp32")
    return device, precision


def peak_bytes_per_rank(cfg, world_size: int) -> int:
    """The planner's predicted peak bytes per rank of one RunConfig at `world_size` on its device
    (on a GPU, state offloaded to the host left out): the memory constraint of `shardbench tune`
    (suite/tune/tuner.py). Planned in this process."""
    from shardbench.trainer.plan.predict import predict

    device, precision = resolved_device(cfg)
    inp = PlanInput.of(cfg, world_size=world_size, seq_len=cfg.effective_seq_len(),
                       grad_accum=cfg.effective_grad_accum(world_size), device=device, precision=precision)
    plan = predict(inp)
    if device == "cpu":  # host and device memory are one: offload frees nothing there
        return int(plan["peak_bytes"])
    return int(plan.get("memory_by_location", {}).get("device", plan["peak_bytes"]))


def predict_specs(specs, timeout_s: float = 600) -> tuple[dict[str, dict], str | None]:
    """({run id: prediction}, why none were made). One subprocess plans every distinct input
    that suite/matrix/plan_cache.py does not already hold."""
    from shardbench.suite.cli.plan_cmd import shape_context

    from shardbench.trainer.plan.planned_layout import NotModelled

    jobs: dict[str, dict] = {}
    keys, refused, kept, cache_keys, shapes = {}, {}, {}, {}, {}
    try:
        for s in specs:
            inp = plan_input(s)
            try:
                layout = inp.layout  # the strategy's, and the mesh degrees'
            except NotModelled as exc:  # said in one line by run, the report and benchtui
                refused[s.run_id] = {"input": inp.to_dict(), "not_modelled": str(exc)}
                continue
            if s.shape not in shapes:  # its values file, read once per shape
                shapes[s.shape] = shape_context(s.shape) if s.shape else ({}, None, {})
            _, mem, links = shapes[s.shape]
            key = json.dumps([inp.to_dict(), mem, links], sort_keys=True, default=str)
            keys[s.run_id] = key
            if key in cache_keys:  # a repeat, or another run of the same input: planned once
                continue
            cache_keys[key] = key + repr(layout)  # the layout too: a row a plugin added or changed
            cached = plan_cache.load(cache_keys[key])
            if cached is not None:
                kept[key] = cached
            else:
                jobs[key] = {"key": key, "input": inp.to_dict(), "device_memory_bytes": mem, "links": links}
    except (TypeError, ValueError, OSError) as exc:
        return {}, f"no plan: {exc}"
    out, why = _plan_in_subprocess(jobs, timeout_s) if jobs else ({}, None)
    if why:
        return refused, why
    for key, prediction in out.items():
        plan_cache.keep(cache_keys[key], prediction)
    out = {**kept, **out}
    return {**refused, **{rid: out[k] for rid, k in keys.items() if k in out}}, None


def _plan_in_subprocess(jobs: dict[str, dict], timeout_s: float) -> tuple[dict[str, dict], str | None]:
    """({job key: prediction}, why none were made): trainer/plan/batch.py over the jobs."""
    try:
        proc = subprocess.run([sys.executable, "-m", "shardbench.trainer.plan.batch"],
                              input=json.dumps(list(jobs.values())),
                              capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
        out: dict[str, Any] = json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return {}, f"no plan: the planner failed ({type(exc).__name__}: {exc})"
    if not out:
        return {}, f"no plan: the planner exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    return out, None


def planned(prediction: dict | None) -> bool:
    """A prediction with numbers (not a layout the planner cannot model, nor a failed plan)."""
    return isinstance(prediction, dict) and "not_modelled" not in prediction and "error" not in prediction


def unplanned(specs, predictions: dict[str, dict]) -> list[str]:
    """One line per run without numbers: "<run id>: not modelled: <why>" or "no plan: <error>"."""
    lines = []
    for s in specs:
        p = predictions.get(s.run_id)
        if isinstance(p, dict) and p.get("not_modelled"):
            lines.append(f"{s.run_id}: not modelled: {p['not_modelled']}")
        elif isinstance(p, dict) and p.get("error"):
            lines.append(f"{s.run_id}: no plan: {p['error']}")
    return lines


def over_memory(specs, predictions: dict[str, dict]) -> list[str]:
    """One line per run predicted over its device's memory."""
    lines = []
    for s in specs:
        p = predictions.get(s.run_id)
        if planned(p) and p.get("fits") is False:  # type: ignore[union-attr]
            lines.append(f"{s.run_id}: predicted peak {p['peak_bytes'] / 2 ** 30:.1f} GiB per rank > "  # type: ignore[index]
                         f"{p['device_memory_bytes'] / 2 ** 30:.0f} GiB on {s.shape} (shardbench plan shows why)")  # type: ignore[index]
    return lines


def plan_lines(specs, predictions: dict[str, dict]) -> list[str]:
    """One line per run for benchtui's plan panel: peak per rank, fit, step time."""
    lines = []
    for s in specs:
        p = predictions.get(s.run_id)
        if not planned(p):
            why = (p or {}).get("not_modelled") or (p or {}).get("error")
            lines.append(f"{s.strategy} w{s.world_size}: " + (f"not modelled: {why}" if (p or {}).get("not_modelled")
                                                            else f"no prediction ({why})" if why else "no prediction"))
            continue
        fits = {True: "fits", False: "DOES NOT FIT", None: "fit unknown"}[p.get("fits")]  # type: ignore[union-attr]
        step = (p.get("step_time") or {}).get("seconds")  # type: ignore[union-attr]
        lines.append(f"{s.strategy} w{s.world_size} s{s.seq_len} mb{s.micro_batch} ga{s.grad_accum}: "
                     f"peak {p['peak_bytes'] / 2 ** 20:,.0f} MiB/rank, {fits}"  # type: ignore[index]
                     + (f", step {step:.3g} s" if step else ""))
    return lines
