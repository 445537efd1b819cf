"""Which runs may be compared: every grouping is "all measured settings equal except ...", and
what may differ comes from the knobs' roles in trainer/config.py (trainer/knobs.py): the one
derivation of the verdict groups, loss groups and scaling bases.

A record's settings are its measured RunConfig fields: the record's `settings` (every knob as
given), else, for records older than that, trainer.config.measured_fields() of the RunConfig its
command line (`args`) parses to; either overridden by every RunConfig field the record itself carries
(what the trainer resolved and ran: precision auto -> fp32, seq len, grad-accum, world size,
launcher; and None for a strategy-specific setting that does not apply: fsdp_grad_sync,
reshard_after_forward, bucket_mib). Records with neither have only the fields they carry. So a
new RunConfig knob joins every grouping without a list to edit here.

- verdict (and summary) groups: everything but the layout (strategy, tp, dp_replicate) and the
  strategy's launcher;
- loss groups (one trajectory): everything but the run's layout (world size, nodes) and the
  knobs marked `same_loss` (strategy, launcher, micro-batch, grad-accum, bucket size, ...), with
  the same resolved global batch;
- efficiency bases: everything but the layout and the knobs marked `per_world` (grad-accum).
"""
from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import MISSING, fields
from typing import Any

from shardbench.trainer import knobs
from shardbench.trainer.contract import STRATEGIES
from shardbench.trainer.config import RunConfig, build_parser, measured_fields

LAYOUT = frozenset({"world_size", "nodes"})
"""The run's shape (measured_fields adds them; not knobs)."""
LAYOUT_KNOBS = knobs.layout()
"""The knobs declared `layout=True` (trainer/config.py): the mesh degrees beside the strategy
(trainer/parallel/layout.py), the pipeline's degree, schedule and stages per rank
(trainer/parallel/pp.py) and where state lives: part of the layout."""
VERDICT_EXCEPT = frozenset({"strategy", "launcher", "grad_accum"}) | LAYOUT_KNOBS
"""What a verdict compares: the layout (strategy and its mesh degrees), the launcher that comes
with the strategy, and grad-accum, which at one global batch (resolved_global_batch, compared)
and micro-batch (compared) follows the data-parallel degree, i.e. the layout (tp 2 of 4 ranks
accumulates twice as many micro-steps): "same settings except the layout"."""


def layout_name(s: dict[str, Any]) -> str:
    """`mesh_name`, and a pipeline after it: "fsdp, pp 2 1F1B", "tp 2, pp 2 GPipe", "pp 4 ZBVZeroBubble"
    (a pipeline alone: one data-parallel rank, no tp)."""
    pp, world = int(s.get("pp") or 1), int(s.get("world_size") or 1)
    if pp == 1:
        return mesh_name(s)
    pipeline = f"pp {pp} {s.get('pp_schedule') or '1F1B'}"
    return pipeline if world == pp else f"{mesh_name(s)}, {pipeline}"


def mesh_name(s: dict[str, Any]) -> str:
    """A run's layout in words, with its degrees: ddp, fsdp, hsdp 2x2, fsdp+tp 2x2, ddp+tp 2x2,
    tp 4 (trainer/parallel/layout.py; the world size from the settings)."""
    strategy, world = str(s.get("strategy")), int(s.get("world_size") or 1)
    tp, rep = int(s.get("tp") or 1), int(s.get("dp_replicate") or 1)
    dp = max(1, world // (tp * int(s.get("pp") or 1)))  # the stages of a pipeline share rows
    info = STRATEGIES.get(strategy)
    hsdp = rep > 1 and info is not None and info.engine == "fsdp"  # FSDP's replicate degree
    name = f"hsdp {rep}x{dp // rep}" if hsdp else strategy
    placed = (f" offload {s['offload']}" if s.get("offload") not in (None, "none") else "") + (
        f" hpz {s['zero_hpz_partition_size']}" if int(s.get("zero_hpz_partition_size") or 1) > 1 else "")
    if tp == 1:
        return name + placed
    return (f"tp {tp}" if dp == 1 else f"{name}+tp {dp}x{tp}") + placed
LOSS_EXCEPT = LAYOUT | knobs.same_loss()
BASE_EXCEPT = LAYOUT | knobs.per_world()

# Where a record keeps a RunConfig field under another name (`knob(record=)` / `column=`).
_RECORD_PATH = {f.name: path for f in knobs.knob_fields() if (path := knobs.record_path(f)) != (f.name,)}


@functools.lru_cache(maxsize=1)
def _parser():
    return build_parser()


@functools.lru_cache(maxsize=4096)
def _from_args(args: tuple[str, ...]) -> dict[str, Any] | None:
    try:
        ns = _parser().parse_args(list(args))
    except SystemExit:
        return None
    return measured_fields(RunConfig(**vars(ns)), 1, 1, None)


@functools.lru_cache(maxsize=1)
def _recorded_only_flags() -> frozenset[str]:
    return frozenset("--" + f.name.replace("_", "-") for f in fields(RunConfig)
                     if f.metadata.get("recorded_only") and f.metadata.get("recorded_only") != "argv")


def _measured_args(args: list[Any]) -> tuple[str, ...]:
    """The command line without recorded-only flags (run id, output dir, ...): what the settings
    depend on, so repeats share one cached parse."""
    skip, out = _recorded_only_flags(), []
    it = iter(map(str, args))
    for a in it:
        if a in skip:
            next(it, None)
        elif a.split("=", 1)[0] not in skip:
            out.append(a)
    return tuple(out)


def _lookup(record: dict[str, Any], name: str) -> Any:
    node: Any = record
    for part in _RECORD_PATH.get(name, (name,)):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def _measured_names() -> list[str]:
    return [f.name for f in knobs.measured()] + sorted(LAYOUT)


@functools.lru_cache(maxsize=1)
def _measured_set() -> frozenset[str]:
    return frozenset(_measured_names())


def settings(record: dict[str, Any]) -> dict[str, Any]:
    """Every measured setting of the run that made this record (see the module docstring)."""
    given, args = record.get("settings"), record.get("args")
    if isinstance(given, dict) and given:  # the knobs as given (trainer.knobs.settings)
        out: dict[str, Any] = {k: v for k, v in given.items() if k in _measured_set()}
    else:  # an older record: the knobs its command line gives
        parsed = _from_args(_measured_args(args)) if isinstance(args, list) and args else None
        out = dict(parsed or {})
    for name in _measured_names():
        value = _lookup(record, name)
        if value is MISSING:
            continue
        out[name] = value  # what the trainer says it ran (None: the setting does not apply to its strategy)
    out.pop("global_batch", None)  # None in measured_fields: grad-accum carries it
    if record.get("global_batch") is not None:
        out["resolved_global_batch"] = record.get("global_batch")
    return out


def key(s: dict[str, Any], except_: frozenset[str]) -> str:
    """One string per combination of the settings outside `except_`."""
    return json.dumps({k: v for k, v in s.items() if k not in except_}, sort_keys=True, default=str)


def specific(settings_list: list[dict[str, Any]]) -> frozenset[str]:
    """Settings that apply to some strategies only: None in some runs, a value in others
    (fsdp_grad_sync, reshard_after_forward, bucket_mib). They never split runs of strategies
    they do not apply to."""
    names = {k for s in settings_list for k in s}
    return frozenset(n for n in names if any(s.get(n) is None for s in settings_list)
                     and any(s.get(n) is not None for s in settings_list))


def loss_key(s: dict[str, Any], ignore: frozenset[str] = frozenset()) -> str:
    return key(s, LOSS_EXCEPT | ignore)


def base_key(s: dict[str, Any]) -> str:
    return key(s, BASE_EXCEPT | {"resolved_global_batch"})


def _dump(v: Any) -> str:
    return json.dumps(v, default=str)


def comparison_groups(items: list[Any], settings_of, except_: frozenset[str] = VERDICT_EXCEPT) -> list[list[Any]]:
    """Items whose settings are equal outside `except_`, a strategy-specific setting counting
    as equal to a run it does not apply to (None): with ddp, fsdp and zero3 at bucket 10 and 25
    MiB, fsdp (no buckets) is in both groups, {ddp 10, zero3 10, fsdp} and {ddp 25, zero3 25, fsdp}."""
    spec = specific([settings_of(i) for i in items])
    coarse: dict[str, list[Any]] = {}
    for i in items:
        coarse.setdefault(key(settings_of(i), except_ | spec), []).append(i)
    out: list[list[Any]] = []
    for members in coarse.values():
        names = sorted(n for n in spec if any(settings_of(i).get(n) is not None for i in members))
        values = [sorted({_dump(settings_of(i).get(n)) for i in members if settings_of(i).get(n) is not None})
                  for n in names]
        if math.prod(len(v) for v in values) > 64:  # a sweep too wide to split: compare them all
            out.append(members)
            continue
        found: list[list[Any]] = []
        for combo in itertools.product(*values):
            chosen = [i for i in members if all(settings_of(i).get(n) is None or _dump(settings_of(i).get(n)) == v
                                                for n, v in zip(names, combo))]
            ids = {id(i) for i in chosen}
            if chosen and not any(ids <= {id(j) for j in f} for f in found):
                found = [f for f in found if not {id(j) for j in f} <= ids] + [chosen]
        out += found
    return out


def merged(settings_list: list[dict[str, Any]]) -> dict[str, Any]:
    """One settings dict for a group: each setting's value where it applies."""
    names = {k for s in settings_list for k in s}
    return {n: next((s[n] for s in settings_list if s.get(n) is not None), None) for n in names}


def shown(name: str, value: Any) -> str | None:
    """A setting as a label shows it, in the flag's words: 'bucket-mib 25', 'reshard-after-forward off';
    None where it does not apply (a strategy-specific knob of a group without that strategy)."""
    if value is None:
        return None
    text = ("on" if value else "off") if isinstance(value, bool) else \
        str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
    return f"{name.replace('_', '-')} {text}"


def differences(settings_list: list[dict[str, Any]], except_: frozenset[str] = frozenset()) -> list[str]:
    """The setting names whose values differ between these runs (what a group label must show)."""
    names = sorted({k for s in settings_list for k in s} - except_)
    return [n for n in names if len({_identity(s.get(n)) for s in settings_list}) > 1]


def _identity(v: Any) -> Any:
    """Equal exactly when json.dumps(v, default=str) is, without dumping plain values: plots and
    tables ask this of every setting of every configuration (8% of a 5,000-run report)."""
    if isinstance(v, str):
        return "s", v
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return "i", int.__repr__(v)
    if isinstance(v, float):
        return "f", float.__repr__(v)
    return "j", _dump(v)
