"""`shardbench plan`: memory, collectives and step time of runs before they are launched, and
the extrapolation table of every values file's shape at 8, 64, 256 and 1024 GPUs
(trainer/plan; docs/planner.md)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:  # torch-free, but imported only once a plan is made
    from shardbench.trainer.plan.inputs import PlanInput


GiB = 2 ** 30
EXTRAPOLATE_WORLDS = (8, 64, 256, 1024)
CATEGORIES = ("params", "grads", "optimizer", "master", "buckets", "gathered_params", "activations", "allocator")


def add_parser(sub) -> None:
    """The flags of `shardbench run` (every knob, generated from RunConfig and MatrixSpec by
    trainer/flags.py; a list sweeps one), --strategy / --world-size / --seq-len as the singular
    spellings of --strategies / --world-sizes / --seq-lens, and the plan's own flags."""
    from shardbench.suite.cli.matrix_flags import add_matrix_flags
    from shardbench.trainer.flags import comma_list

    p = sub.add_parser("plan", help="predict memory, collectives and step time per run (fits / does not fit)",
                       description="Plan the runs `shardbench run` would make with the same flags (default: the "
                                   "default matrix). A shape with GPUs is planned as laid out on its nodes.")
    p.error = lambda message: p.exit(2, f"shardbench plan: {message} (see shardbench plan --help)\n")  # one line
    p.add_argument("--matrix", type=Path, help="matrix YAML to plan (default: the default matrix); flags override it")
    add_matrix_flags(p)
    p.add_argument("--strategy", dest="strategies", type=comma_list(str), default=None, metavar="A,B",
                   help="= --strategies")
    p.add_argument("--world-size", dest="world_sizes", type=comma_list(int), default=None, metavar="A,B",
                   help="= --world-sizes")
    p.add_argument("--seq-len", dest="seq_lens", type=comma_list(int), default=None, metavar="A,B",
                   help="= --seq-lens")
    p.add_argument("--calibrate", type=Path, default=None,
                   help="a results dir: compute rate from its world-size-1 run of the same configuration "
                        "(achieved FLOP/s); refused when it has none")
    p.add_argument("--extrapolate", action="store_true",
                   help="the table for every values file's shape at 8, 64, 256, 1024 GPUs")
    p.add_argument("--json", action="store_true", help="print the predictions as JSON")
    p.add_argument("--preflight-log", type=Path, default=None,
                   help="the pre-flight's launcher log (helm install ... --set mode=preflight): its measured "
                        "busbw at the largest size replaces the shape's assumed link bandwidth")


def _values(shape: str) -> dict:
    from shardbench.suite.matrix.expand import values_dir

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
        "shape": s.get("name") or shape,
        "gpus_per_node": s.get("gpusPerNode") or v.get("gpusPerWorker") or 1, "peak_tflops": s.get("peakTflopsBf16"),
        "intra_node_GBps": links.get("intraNodeGBps"), "inter_node_GBps": links.get("interNodeGBps"),
        "alpha_us": links.get("alphaUs"), "cpu_shared_slowdown": links.get("cpuSharedSlowdown"),
        "op_busbw_GBps": links.get("opBusbwGBps"), "host_link_GBps": links.get("hostLinkGBps")}


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


def _same_run(inp, record: dict) -> bool:
    """A world-size-1 record measured the configuration `inp` plans (at any world size and
    grad-accum: the same strategy, model, tokens per micro-step, precision, device and recompute)."""
    from shardbench.trainer.plan.inputs import PlanInput

    try:
        other = PlanInput.from_record(record)
        return (other.model_config() == inp.model_config() and other.effective_seq_len() == inp.effective_seq_len()
                and all(getattr(other, k) == getattr(inp, k)
                        for k in ("strategy", "micro_batch", "precision", "device", "activation_checkpointing")))
    except (KeyError, TypeError, ValueError):
        return False


def one_rank_records(results: Path) -> list[dict]:
    """The ok world-size-1 records under `results` with a measured throughput."""
    out = []
    for path in sorted(results.glob("**/result.json")) + sorted(results.glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if (isinstance(r, dict) and r.get("status") == "ok" and r.get("world_size") == 1 and r.get("tokens_per_s")
                and r.get("flops_per_token")):
            out.append({**r, "run_id": r.get("run_id") or path.parent.name})
    return out


def calibration(records: list[dict], inp) -> dict | None:
    """Achieved FLOP/s of one rank: the fastest of `records` (ok, world size 1) that ran the
    configuration `inp` plans; None when none did (another configuration's rate is not its own)."""
    from shardbench.trainer.plan import timing

    best: dict[str, Any] | None = None
    for r in records:
        if not _same_run(inp, r):
            continue
        rate = timing.achieved_flops(r)
        if best is None or rate > best["achieved_flops"]:
            best = {"achieved_flops": rate, "source": f"calibrated: {r['run_id']} "
                                                       f"({rate / 1e9:.2f} GFLOP/s achieved at world size 1)"}
    return best


def plan_inputs(args) -> list[tuple[PlanInput, str | None]]:
    """(PlanInput, shape) of every configuration `shardbench run` would make with these flags
    (repeat 0, one per distinct input), expanded and validated as run does; ValueError (one
    line) when the matrix is invalid."""
    from dataclasses import replace

    from shardbench.suite.cli.matrix_flags import effective_matrix
    from shardbench.suite.matrix.expand import expand, load_shape, on_cluster
    from shardbench.suite.matrix.planning import plan_input

    matrix = effective_matrix(args)
    if not on_cluster(matrix) and matrix.shape and args.backend is None and load_shape(matrix.shape).gpus_per_node:
        args.backend = "kubernetes"  # a GPU shape is planned as laid out on its nodes, with its run defaults
        matrix = effective_matrix(args)
    worlds = [w for w in matrix.world_sizes if isinstance(w, int)] if isinstance(matrix.world_sizes, list) else []
    if matrix.max_world_size is None and not on_cluster(matrix) and worlds:
        matrix = replace(matrix, max_world_size=max(max(worlds), 1))  # a plan is not bounded by this machine
    specs, errors = expand(matrix, limit=None)
    if errors:
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise ValueError(f"{errors[0]}{more}")
    out: dict[str, tuple[PlanInput, str | None]] = {}
    for spec in specs:
        inp = plan_input(spec)
        out.setdefault(json.dumps([inp.to_dict(), spec.shape], sort_keys=True, default=str), (inp, spec.shape))
    return list(out.values())


def _gib(n, unit: int = GiB) -> str:
    return "-" if n is None else f"{n / unit:.2f}"


def _comm(c: dict) -> str:
    return ", ".join(f"{op} {v['calls']:g}x {v['bytes'] / 2 ** 20:.1f}MiB" for op, v in sorted(c.items())) or "none"


def _varying(inputs) -> list[str]:
    """The PlanInput fields (beyond strategy and world size) that differ between `inputs`."""
    names = [k for k in inputs[0].to_dict() if k not in ("strategy", "world_size")] if inputs else []
    return [k for k in names if len({repr(getattr(i, k)) for i in inputs}) > 1]


def table(preds: list[dict], varying: list[str] = ()) -> list[str]:  # type: ignore[assignment]
    """One row per prediction; `varying`: fields shown in a config column (a sweep)."""
    unit = GiB if any(p["peak_bytes"] >= GiB for p in preds) else 2 ** 20
    name = "GiB" if unit == GiB else "MiB"
    head = (["strategy", "N"] + (["config"] if varying else []) + [f"{c[:8]} {name}" for c in CATEGORIES]
            + [f"peak {name}", "fits", "step s", "comm per step"])
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for p in preds:
        i, m, st = p["input"], p["memory"], p["step_time"]
        fits = {True: "yes", False: "NO", None: "?"}[p["fits"]]
        step = f"{st['seconds']:.3g}" if st.get("seconds") else "-"
        config = [" ".join(f"{k}={i[k]}" for k in varying)] if varying else []
        lines.append(" | ".join([i["strategy"], str(i["world_size"])] + config
                                + [_gib(m.get(c), unit) for c in CATEGORIES]
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
    from shardbench.suite.matrix.expand import values_dir
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
                      f"{run.get('precision')}, {_gib(mem)} GiB per GPU, {links.get('gpus_per_node')} GPUs per node",
                      ""]
        lines += table(preds) + sorted({f"{r['input']['strategy']}: not modelled: {r['not_modelled']}"
                                        for r in refused})
        lines += ["", "Assumptions:"] + [f"- {a}" for a in assumptions(preds, links)]
    return lines


def _predict_all(inputs, mem, links, cal) -> tuple[list[dict], list[dict]]:
    """(predictions, {"input", "not_modelled": why} for each layout the planner has no model of).
    `cal`: one calibration for all, or a callable input -> calibration."""
    from shardbench.trainer.plan.planned_layout import NotModelled
    from shardbench.trainer.plan.predict import predict

    preds, refused = [], []
    for i in inputs:
        try:
            preds.append(predict(i, mem, links, cal(i) if callable(cal) else cal))
        except NotModelled as exc:
            refused.append({"input": i.to_dict(), "not_modelled": str(exc)})
    return preds, refused


def _label(inp) -> str:
    return f"{inp.strategy} {inp.model} seq {inp.effective_seq_len()} micro-batch {inp.micro_batch} {inp.precision}"


def _calibrations(args, inputs) -> dict[int, dict | None]:
    """Input index -> its calibration from --calibrate (a world-size-1 run of its configuration).
    ValueError when the directory holds none for any planned configuration (another
    configuration's rate would be passed off as this one's); a warning per one left uncalibrated."""
    if args.calibrate is None:
        return {}
    if not args.calibrate.is_dir():
        raise ValueError(f"--calibrate {args.calibrate}: no such results directory")
    records = one_rank_records(args.calibrate)
    out = {n: calibration(records, inp) for n, inp in enumerate(inputs)}
    if not any(out.values()):
        have = sorted({r.get("run_id", "?") for r in records})[:3]
        raise ValueError(f"--calibrate {args.calibrate} has no ok world-size-1 run of the planned configuration "
                         f"({_label(inputs[0])}; it has {', '.join(have) or 'none'}): run one "
                         "(--world-sizes 1), or drop --calibrate")
    for label in sorted({_label(inputs[n]) for n, c in out.items() if c is None}):
        print(f"shardbench plan: warning: --calibrate {args.calibrate} has no world-size-1 run of {label}: "
              "its compute rate is the shape's assumed one", file=sys.stderr)
    return out


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        planned = plan_inputs(args)
        shape = planned[0][1]
        _, mem, links = shape_context(shape)
        if args.preflight_log is not None:
            links = preflight_links(args.preflight_log.read_text(errors="replace"), links)
        inputs = [inp for inp, _ in planned]
        cals = _calibrations(args, inputs)
    except OSError as exc:
        print(f"shardbench plan: cannot read {exc.filename or args.preflight_log}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except (ValueError, TypeError) as exc:
        print(f"shardbench plan: {exc}", file=sys.stderr)
        return 2
    index = {id(i): n for n, i in enumerate(inputs)}
    preds, refused = _predict_all(inputs, mem, links, lambda i: cals.get(index[id(i)]))
    if args.json:
        print(json.dumps(preds + refused, indent=1))
        return 0
    i0 = inputs[0]
    print(f"# plan: {i0.model} seq {i0.effective_seq_len()} micro-batch {i0.micro_batch} grad-accum {i0.grad_accum} "
          f"{i0.precision} on {i0.device}" + (f", shape {shape} ({_gib(mem)} GiB per device)" if mem else "")
          + ("; the config column says what differs" if _varying(inputs) else ""))
    print("\nMemory per rank by category, the peak with allocator overhead, collectives and step time:\n")
    print("\n".join(table(preds, _varying(inputs))))
    for r in refused:  # one line each, never a traceback nor a silent drop
        print(f"{r['input']['strategy']} w{r['input']['world_size']}: not modelled: {r['not_modelled']}")
    print("\nAssumptions:\n" + "\n".join(f"- {a}" for a in assumptions(preds, links)))
    if args.extrapolate:
        print("\n# Extrapolation: every values file's shape at 8, 64, 256, 1024 GPUs")
        print("\n".join(extrapolation(list(dict.fromkeys(i.strategy for i in inputs)))))
    return 0
