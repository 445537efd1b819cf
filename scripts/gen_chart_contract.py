"""Writes the trainer's facts the chart needs into chart/files/contract.json, the enums, bounds and
defaults of chart/values.schema.json and chart/files/ds_configs/ (the trainer's DeepSpeed
configs), so the chart never keeps its own copy of them.

    python scripts/gen_chart_contract.py          # rewrite both files
    python scripts/gen_chart_contract.py --check  # exit 1 naming each file that is out of date

The templates read contract.json with .Files.Get (which strategies run on DeepSpeed, each
preset's block size, the variables every rank must get, the first-class `run:` values and their
trainer flags: `runFlags`, from trainer/config.py fields marked chart=True); helm validates values against the
schema's enums before rendering. tests/chart/test_chart_contract.py fails when the checked-in
files differ from what this script writes. Imports no torch.
"""
from __future__ import annotations

import argparse
import json
import sys
import typing
from dataclasses import fields
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shardbench.trainer import knobs, launchers, rules  # noqa: E402
from shardbench.trainer.config import RunConfig  # noqa: E402
from shardbench.trainer.contract import (CLUSTER_LAUNCHERS, DEVICES, OFFLOADS, PRECISIONS, STRATEGIES,  # noqa: E402
                                         state_layout)
from shardbench.trainer.presets import PRESETS  # noqa: E402

CONTRACT = REPO / "chart" / "files" / "contract.json"
SCHEMA = REPO / "chart" / "values.schema.json"
DS_CONFIGS = REPO / "chart" / "files" / "ds_configs"
TRAINER_DS_CONFIGS = REPO / "trainer" / "ds_configs"
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def run_flags() -> list[dict]:
    """The first-class `run:` values in flag order: the chart's template writes `flag value` for
    each (booleans: flag or noFlag; gradAccum: derived from globalBatch when that is set)."""
    out = []
    for f in knobs.chart_fields():
        kind = knobs.base_type(RunConfig, f.name)
        out.append({"value": knobs.camel(f.name), "flag": "--" + f.name.replace("_", "-"),
                    "noFlag": "--no-" + f.name.replace("_", "-"), "type": _JSON_TYPES.get(kind, "string")})
    return out


def run_property(f, current: dict) -> dict:
    """The schema of one first-class run value: enum for a Literal, else type and bounds."""
    kind, prop = knobs.base_type(RunConfig, f.name), dict(current)
    if typing.get_origin(kind) is typing.Literal:
        prop["enum"] = list(typing.get_args(kind))
        return prop
    prop["type"] = _JSON_TYPES.get(kind, "string")
    for key, word in BOUNDS:
        if f.metadata.get(key) is not None:
            prop[word] = f.metadata[key]
    return prop


BOUNDS = (("min", "minimum"), ("above", "exclusiveMinimum"), ("max", "maximum"), ("below", "exclusiveMaximum"))
"""knob() bounds -> their JSON Schema keywords."""
NUMERIC_TEXT = r"^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][+-]?[0-9]+)?$"
"""A number written as text: `helm --set x=0.5` passes 0.5 as the string "0.5" (only integers
are typed), so every number value also takes this; the templates write it verbatim and
`shardbench.validateNumbers` (templates/_numbers.tpl) checks its bounds."""


def _numbers(node: dict, path: str = "") -> dict[str, dict]:
    """Every number value of the schema (path -> its bounds), each made to accept numeric text:
    the type list gains "string" and a pattern that only a number matches (JSON Schema applies
    `pattern` to strings only, the bounds to numbers only)."""
    out: dict[str, dict] = {}
    for key, prop in (node.get("properties") or {}).items():
        where = f"{path}.{key}" if path else key
        kind = prop.get("type")
        kinds = kind if isinstance(kind, list) else [kind]
        if "number" in kinds and "pattern" not in prop or prop.get("pattern") == NUMERIC_TEXT:
            prop["type"] = [k for k in kinds if k != "string"] + ["string"]
            prop["pattern"] = NUMERIC_TEXT
            out[where] = {word: prop[word] for _, word in BOUNDS if word in prop}
        out.update(_numbers(prop, where))
    return out


def ds_configs() -> dict[Path, str]:
    """chart/files/ds_configs/<strategy>.json: the trainer's packaged config of each DeepSpeed
    strategy, that of its ZeRO stage (trainer/ds_knobs.py `config_path`)."""
    return {DS_CONFIGS / f"{name}.json": (TRAINER_DS_CONFIGS / f"zero{s.zero_stage}.json").read_text()
            for name, s in STRATEGIES.items() if s.engine == "deepspeed"}


def strategy_facts() -> dict[str, dict]:
    """strategy -> engine and the launcher it runs under by default."""
    return {name: {"engine": s.engine, "deepspeed": s.engine == "deepspeed", "zeroStage": s.zero_stage,
                   "defaultLauncher": s.default_launcher} for name, s in STRATEGIES.items()}


def contract(current: dict) -> dict:
    return {
        "_generated": "by scripts/gen_chart_contract.py from the trainer's tables: do not edit",
        "strategies": strategy_facts(),
        # params: what the chart sizes the checkpoint volume from.
        "presets": {name: {"blockSize": p.block_size, "defaultSeqLen": p.default_seq_len, "params": p.n_params()}
                    for name, p in PRESETS.items()},
        "precisions": list(PRECISIONS),
        "devices": list(DEVICES),
        "clusterLaunchers": list(CLUSTER_LAUNCHERS),
        "runEnvVars": list(launchers.RUN_ENV_VARS),
        "containerEnvVars": list(launchers.CONTAINER_ENV_VARS),
        "mpirunBaseFlags": list(launchers.MPIRUN_BASE_FLAGS),
        "unboundFlags": list(launchers.UNBOUND_FLAGS),
        # numa_bound_flags(N) with N as a placeholder the chart fills with ranks per NUMA domain.
        "numaBoundFlags": launchers.numa_bound_flags(0),
        "runFlags": run_flags(),
        "numbers": number_bounds(current),
    }


def _default(name: str):
    return next(f.default for f in fields(RunConfig) if f.name == name)


def schema(current: dict) -> dict:
    """`current` with the trainer-owned enums and defaults replaced; everything else kept."""
    out = json.loads(json.dumps(current))
    run = out["properties"]["run"]["properties"]
    for f in knobs.chart_fields():
        run[knobs.camel(f.name)] = run_property(f, run.get(knobs.camel(f.name), {}))
    run["strategy"]["enum"] = list(STRATEGIES)
    run["model"]["enum"] = list(PRESETS)
    run["model"]["default"] = _default("model")
    run["precision"]["enum"] = list(PRECISIONS)
    run["precision"]["default"] = _default("precision")
    run["device"]["enum"] = list(DEVICES)
    out["properties"]["launcher"]["enum"] = list(CLUSTER_LAUNCHERS)
    out["properties"]["run"]["allOf"] = layout_rules()
    _numbers(out)
    return out


def layout_rules() -> list[dict]:
    """The impossible layouts JSON Schema can say on run: alone (trainer/rules.py _layout_errors,
    _state_errors): tensor parallel only with the torch engines, HSDP's replicate degree only with
    FSDP, offload only where rules.state_error lets the row place its state and without tp or pp, hpZ at ZeRO-3 without
    --offload params. Products
    with the world size and gpusPerWorker are the template's (shardbench.validateLayout)."""
    def engines(*names: str) -> list[str]:
        return [n for n, s in STRATEGIES.items() if s.engine in names]

    def above_one(key: str) -> dict:
        return {"properties": {key: {"minimum": 2}}, "required": [key]}  # typed by run.<key> itself

    def placing(offload: str) -> list[str]:  # the rows that can keep state where --offload says
        return [n for n in STRATEGIES if not rules.state_error(state_layout(n, offload), n)]

    def offload_is(value: str) -> dict:
        return {"properties": {"offload": {"const": value}}, "required": ["offload"]}

    stage3 = [n for n, s in STRATEGIES.items() if s.zero_stage == 3]
    return [{"if": above_one("tp"), "then": {"properties": {"strategy": {"enum": engines("ddp", "fsdp")}}}},
            {"if": above_one("dpReplicate"), "then": {"properties": {"strategy": {"enum": engines("fsdp")}}}},
            {"if": above_one("pp"), "then": {"properties": {"strategy": {"enum": engines("ddp", "fsdp")}}}},
            *({"if": offload_is(o), "then": {"properties": {"strategy": {"enum": placing(o)}}}}
              for o in OFFLOADS if o != "none"),
            {"if": {"properties": {"offload": {"not": {"const": "none"}}}, "required": ["offload"]},  # data parallel
             "then": {"properties": {"tp": {"maximum": 1}, "pp": {"maximum": 1}}}},                   # only (rules)
            {"if": above_one("zeroHpzPartitionSize"),  # ZeRO++ hpZ: stage 3, its secondary copy on the device
             "then": {"properties": {"strategy": {"enum": stage3}, "offload": {"not": {"const": "params"}}}}}]


def number_bounds(current: dict) -> dict[str, dict]:
    """Path -> bounds of every number value (contract.json `numbers`, for the template check of
    numbers given as text)."""
    return _numbers(schema(current))


def rendered() -> dict[Path, str]:
    current = json.loads(SCHEMA.read_text())
    return {CONTRACT: json.dumps(contract(current), indent=2) + "\n",
            SCHEMA: json.dumps(schema(current), indent=2) + "\n", **ds_configs()}


def extra_files() -> list[Path]:
    """Files in chart/files/ds_configs/ that no DeepSpeed strategy has any more."""
    want = set(ds_configs())
    return sorted(p for p in DS_CONFIGS.glob("*.json") if p not in want)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report files that are out of date")
    args = parser.parse_args(argv)
    stale = [path for path, text in rendered().items() if not path.is_file() or path.read_text() != text]
    stale += extra_files()
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is out of date: run python scripts/gen_chart_contract.py", file=sys.stderr)
        return 1 if stale else 0
    for path in extra_files():
        path.unlink()
    for path, text in rendered().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
