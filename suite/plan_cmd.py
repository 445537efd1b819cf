"""`shardbench plan`: memory, collectives and step time of runs before they are launched, and
the extrapolation table of every values file's shape at 8, 64, 256 and 1024 GPUs
(trainer/plan; docs/planner.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from shardbench.trainer.contract import STRATEGIES
from shardbench.trainer.presets import PRESETS

GiB = 2 ** 30
EXTRAPOLATE_WORLDS = (8, 64, 256, 1024)
CATEGORIES = ("params", "grads", "optimizer", "master", "buckets", "gathered_params", "activations", "allocator")


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="predict memory, collectives and step time per run (fits / does not fit)")
    p.add_argument("--strategy", default=",".join(STRATEGIES), help="strategies, comma-separated (default: all)")
    p.add_argument("--world-size", default="1,2,4", help="world sizes, comma-separated (default: 1,2,4)")
    p.add_argument("--shape", default=None, help="values/<shape>.yaml: device memory, links, peak and run defaults")
    p.add_argument("--model", default=None, choices=sorted(PRESETS), help="model preset (default: the shape's, else tiny)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--micro-batch", type=int, default=None)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"))
    p.add_argument("--device", default=None, choices=("cpu", "cuda"))
    p.add_argument("--activation-checkpointing", action="store_true")
    p.add_argument("--calibrate", type=Path, default=None,
                   help="a results dir: compute rate from its world-size-1 runs (achieved FLOP/s)")
    p.add_argument("--extrapolate", action="store_true",
                   help="the table for every values file's shape at 8, 64, 256, 1024 GPUs")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument("--preflight-log", type=Path, default=None,
                   help="the pre-flight's launcher log (helm install ... --set mode=preflight): its measured "
                        "busbw at the largest size replaces the shape's assumed link bandwidth")


def _values(shape: str) -> dict:
    from shardbench.suite.matrix import values_dir

    path = values_dir() / f"{shape}.yaml"
    if not path.is_file():
        raise ValueError(f"unknown shape {shape!r}: no {path} (see values/)")
    return yaml.safe_load(path.read_text()) or {}


def shape_context(shape: str | None) -> tuple[dict, int | None, dict]:
    """(the shape's run defaults, device memory bytes, links for timing)."""
    if not shape:
        return {}, None, {}
    v = _values(shape)
    s, links = v.get("shape") or {}, v.get("links") or {}
    mem = int(float(s["gpuMemoryGiB"]) * GiB) if s.get("gpuMemoryGiB") else None
    return (v.get("run") or {}), mem, {
        "gpus_per_node": s.get("gpusPerNode") or v.get("gpusPerWorker") or 1, "peak_tflops": s.get("peakTflopsBf16"),
        "intra_node_GBps": links.get("intraNodeGBps"), "inter_node_GBps": links.get("interNodeGBps"),
        "alpha_us": links.get("alphaUs"), "cpu_shared_slowdown": links.get("cpuSharedSlowdown"),
        "op_busbw_GBps": links.get("opBusbwGBps")}


def preflight_links(text: str, links: dict) -> dict:
    """The shape's links with the pre-flight's measurements in place of the assumed ones: the
    busbw of the largest message (across nodes the per-GPU share of the inter-node link, else
    intra-node) and alpha, the smallest message's time less its bandwidth term (per log2 N, the
    timing model's latency per call; chart/files/preflight.py or benchmarks/gloo_links.py print
    the table). ValueError when the log has no pre-flight table."""
    import math
    import re

    head = re.search(r"preflight: all-reduce over (\d+) ranks on (\d+) node", text)
    rows = re.findall(r"^\s*(\d+)\s+([\d.]+)\s+[\d.]+\s+([\d.]+)\s*$", text, flags=re.M)
    if not head or not rows:
        raise ValueError("no pre-flight table in the log (expected chart/files/preflight.py's output)")
    busbw = float(max(rows, key=lambda r: int(r[0]))[2])
    world, nodes = int(head.group(1)), int(head.group(2))
    size, time_us, _ = min(rows, key=lambda r: int(r[0]))
    wire = int(size) * 2 * (world - 1) / world / (busbw * 1e9) * 1e6 if busbw else 0.0
    alpha_us = max(0.0, float(time_us) - wire) / max(1.0, math.log2(world))
    where = f"across {nodes} nodes" if nodes > 1 else "within a node"
    measured = {"alpha_us": round(alpha_us, 1),
                "busbw_source": f"pre-flight: {busbw:g} GB/s busbw per GPU {where}, alpha {alpha_us:.0f} us "
                                f"(the {int(size)}-byte all-reduce's {float(time_us):g} us)"}
    if nodes > 1:
        return {**links, **measured, "inter_node_GBps": busbw * (links.get("gpus_per_node") or 1)}
    return {**links, **measured, "intra_node_GBps": busbw}


def calibration(results: Path | None, device: str) -> dict | None:
    """Achieved FLOP/s of one rank from the fastest world-size-1 ok run in `results`."""
    if results is None:
        return None
    best = None
    for path in sorted(results.glob("**/result.json")) + sorted(results.glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(r, dict) or r.get("status") != "ok" or r.get("world_size") != 1 or r.get("device") != device:
            continue
        if r.get("tokens_per_s") and r.get("flops_per_token"):
            rate = r["tokens_per_s"] * r["flops_per_token"]
            if best is None or rate > best["achieved_flops"]:
                best = {"achieved_flops": rate, "source": f"calibrated: {r.get('run_id') or path.parent.name} "
                                                           f"({rate / 1e9:.2f} GFLOP/s achieved at world size 1)"}
    return best


def _inputs(args, run: dict):
    from shardbench.trainer.plan.inputs import PlanInput

    device = args.device or run.get("device") or "cpu"
    precision = args.precision or run.get("precision") or ("bf16" if device == "cuda" else "fp32")
    model = args.model or run.get("model") or "tiny"
    strategies = [s.strip() for s in args.strategy.split(",") if s.strip()]
    bad = [s for s in strategies if s not in STRATEGIES]
    if bad:
        raise ValueError(f"unknown strategy {bad[0]!r} (choose from {', '.join(STRATEGIES)})")
    try:
        worlds = [int(w) for w in args.world_size.split(",")]
    except ValueError:
        raise ValueError(f"--world-size {args.world_size!r}: give integers, e.g. 1,2,4") from None
    if any(w < 1 for w in worlds):
        raise ValueError("--world-size: every world size must be at least 1")
    return [PlanInput(strategy=s, world_size=w, model=model, seq_len=args.seq_len or run.get("seqLen"),
                      micro_batch=args.micro_batch or run.get("microBatch") or 4, grad_accum=args.grad_accum,
                      precision=precision, device=device,
                      activation_checkpointing=args.activation_checkpointing)
            for s in strategies for w in worlds]


def _gib(n, unit: int = GiB) -> str:
    return "-" if n is None else f"{n / unit:.2f}"


def _comm(c: dict) -> str:
    return ", ".join(f"{op} {v['calls']:g}x {v['bytes'] / 2 ** 20:.1f}MiB" for op, v in sorted(c.items())) or "none"


def table(preds: list[dict]) -> list[str]:
    unit = GiB if any(p["peak_bytes"] >= GiB for p in preds) else 2 ** 20
    name = "GiB" if unit == GiB else "MiB"
    head = ["strategy", "N"] + [f"{c[:8]} {name}" for c in CATEGORIES] + [f"peak {name}", "fits", "step s", "comm per step"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for p in preds:
        i, m, st = p["input"], p["memory"], p["step_time"]
        fits = {True: "yes", False: "NO", None: "?"}[p["fits"]]
        step = f"{st['seconds']:.3g}" if st.get("seconds") else "-"
        lines.append(" | ".join([i["strategy"], str(i["world_size"])] + [_gib(m.get(c), unit) for c in CATEGORIES]
                                + [_gib(p["peak_bytes"], unit), fits, step, _comm(p["comm_per_step"])]))
    return lines


def assumptions(preds: list[dict], links: dict) -> list[str]:
    out = sorted({a for p in preds for a in p["assumptions"]})
    out += sorted({f"{p['input']['strategy']}: overlap: {p['step_time'].get('overlap')}" for p in preds
                   if p["step_time"].get("overlap")})
    out += sorted({f"compute: {p['step_time'].get('compute_source') or p['step_time'].get('why')}" for p in preds})
    out += sorted({f"method ({p['input']['strategy']} N={p['input']['world_size']}): {p['method']}" for p in preds})[:6]
    if links.get("busbw_source"):
        out.append(f"links measured: {links['busbw_source']}")
    if links:
        out.append(f"links: intra-node {links.get('intra_node_GBps')} GB/s, inter-node {links.get('inter_node_GBps')} "
                   f"GB/s per node / {links.get('gpus_per_node')} GPUs, alpha {links.get('alpha_us')} us"
                   + "".join(f", {op} {bw} GB/s" for op, bw in (links.get("op_busbw_GBps") or {}).items())
                   + (f"; CPU compute x{links['cpu_shared_slowdown']} when ranks share the machine"
                      if links.get("cpu_shared_slowdown") else ""))
    return out


def extrapolation(strategies: list[str]) -> list[str]:
    from shardbench.suite.matrix import values_dir
    from shardbench.trainer.plan.inputs import PlanInput

    lines = []
    for path in sorted(values_dir().glob("*.yaml")):
        run, mem, links = shape_context(path.stem)
        device = run.get("device") or "cpu"
        if device != "cuda":
            continue
        preds, refused = _predict_all([PlanInput(strategy=s, world_size=w, model=run.get("model") or "tiny",
                                                 seq_len=run.get("seqLen"), micro_batch=run.get("microBatch") or 1,
                                                 precision=run.get("precision") or "bf16", device=device)
                                       for s in strategies for w in EXTRAPOLATE_WORLDS], mem, links, None)
        lines += ["", f"## {path.stem}: {run.get('model')} seq {run.get('seqLen')} micro-batch {run.get('microBatch')} "
                      f"{run.get('precision')}, {_gib(mem)} GiB per GPU, {links.get('gpus_per_node')} GPUs per node", ""]
        lines += table(preds) + sorted({f"{r['input']['strategy']}: not modelled: {r['not_modelled']}" for r in refused})
        lines += ["", "Assumptions:"] + [f"- {a}" for a in assumptions(preds, links)]
    return lines


def _predict_all(inputs, mem, links, cal) -> tuple[list[dict], list[dict]]:
    """(predictions, {"input", "not_modelled": why} for each layout the planner has no model of)."""
    from shardbench.trainer.plan.layout import NotModelled
    from shardbench.trainer.plan.predict import predict

    preds, refused = [], []
    for i in inputs:
        try:
            preds.append(predict(i, mem, links, cal))
        except NotModelled as exc:
            refused.append({"input": i.to_dict(), "not_modelled": str(exc)})
    return preds, refused


def cmd_plan(args: argparse.Namespace) -> int:

    try:
        run, mem, links = shape_context(args.shape)
        inputs = _inputs(args, run)
        if args.preflight_log is not None:
            links = preflight_links(args.preflight_log.read_text(errors="replace"), links)
    except OSError as exc:
        print(f"shardbench plan: cannot read {args.preflight_log}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"shardbench plan: {exc}", file=sys.stderr)
        return 2
    cal = calibration(args.calibrate, inputs[0].device)
    preds, refused = _predict_all(inputs, mem, links, cal)
    if args.json:
        print(json.dumps(preds + refused, indent=1))
        return 0
    i0 = inputs[0]
    print(f"# plan: {i0.model} seq {i0.effective_seq_len()} micro-batch {i0.micro_batch} grad-accum {i0.grad_accum} "
          f"{i0.precision} on {i0.device}" + (f", shape {args.shape} ({_gib(mem)} GiB per device)" if args.shape else ""))
    print("\nMemory per rank by category, the peak with allocator overhead, collectives and step time:\n")
    print("\n".join(table(preds)))
    for r in refused:  # one line each, never a traceback nor a silent drop
        print(f"{r['input']['strategy']} w{r['input']['world_size']}: not modelled: {r['not_modelled']}")
    print("\nAssumptions:\n" + "\n".join(f"- {a}" for a in assumptions(preds, links)))
    if args.extrapolate:
        print("\n# Extrapolation: every values file's shape at 8, 64, 256, 1024 GPUs")
        print("\n".join(extrapolation([i.strategy for i in inputs if i.world_size == inputs[0].world_size])))
    return 0
