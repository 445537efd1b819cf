"""What each RunConfig field is to the rest of shardbench, derived from its type and metadata
(trainer/config.py `knob()`), so a new knob is one field there and nothing else.

Every field but `argv` is a trainer flag, a matrix key, a `shardbench run` flag and a key of the
record's `settings`. From the metadata:
- measured (not `recorded_only`): part of the config id, a metrics.csv column (unless the CSV
  already has the column, or `column=` names it), a key of every scaling base;
- a measured field is in the loss check's group (runs must share it to be compared step by step)
  unless `same_loss=True` says runs that differ only there must follow one curve; the batch is
  compared through the global batch the run resolved (suite/analyze/groups.py reads these roles:
  the one derivation of every grouping);
- `per_world=True`: follows the world size at a fixed global batch, so not in a scaling base;
- `chart=True`: a first-class chart value `run.<camelCase>` whose flag the chart's template
  writes from chart/files/contract.json (scripts/gen_chart_contract.py); any other knob reaches a
  cluster run through run.extraArgs.
A field added the plain way (`x: int = 3`, or `knob(3, min=1)`) is thus measured, splits loss
groups and scaling bases, gets a CSV column and goes to the chart in extraArgs: the safe default.
Torch-free (the suite and the TUI import it at start-up).
"""
from __future__ import annotations

import typing
from dataclasses import MISSING, Field, fields
from typing import Any, Callable, Literal

from shardbench.trainer.config import SECTIONS, RunConfig, to_argv
from shardbench.trainer.fielddocs import field_docs

SUITE_SET = ("run_id", "repeat", "output_dir")
"""Fields the suite sets per run from its own bookkeeping (never a matrix key)."""


def _meta(f: Field, key: str) -> Any:
    return f.metadata.get(key)


def knob_fields(cls: type = RunConfig) -> list[Field]:
    """Every setting of a run (RunConfig's fields less `argv`, the command line itself)."""
    return [f for f in fields(cls) if _meta(f, "recorded_only") != "argv"]


def measured(cls: type = RunConfig) -> list[Field]:
    return [f for f in knob_fields(cls) if not _meta(f, "recorded_only")]


def field_of(name: str, cls: type = RunConfig) -> Field:
    """RunConfig's field of that name."""
    return next(f for f in fields(cls) if f.name == name)


def default(name: str, cls: type = RunConfig) -> Any:
    """RunConfig's default of a field (MISSING for strategy): the one place it is written."""
    f = field_of(name, cls)
    return f.default_factory() if f.default_factory is not MISSING else f.default


def section(f: Field) -> str:
    """The field's section (trainer.config.SECTIONS, declared in `knob(section=)`)."""
    return _meta(f, "section") or ""


def by_section(cls: type = RunConfig, names: typing.Iterable[str] | None = None) -> dict[str, list[Field]]:
    """The knobs (or only `names`) grouped by section, in SECTIONS order, each in declaration
    order: the order of the trainer's --help groups, the record's settings and docs/knobs.md."""
    wanted = None if names is None else set(names)
    out: dict[str, list[Field]] = {name: [] for name in SECTIONS}
    for f in knob_fields(cls):
        if wanted is None or f.name in wanted:
            out.setdefault(section(f), []).append(f)
    return {name: group for name, group in out.items() if group}


def settings(cfg: Any) -> dict[str, Any]:
    """The record's `settings`: every knob of the run as given (JSON values), flat (readers and
    older records agree on one level) and listed section by section."""
    return {f.name: getattr(cfg, f.name) for group in by_section(type(cfg)).values() for f in group}


def column(f: Field) -> str:
    """The metrics.csv column of a measured field."""
    return _meta(f, "column") or f.name


def same_loss(cls: type = RunConfig) -> frozenset[str]:
    """Measured fields runs of one loss group may differ in (suite/analyze/groups.py LOSS_EXCEPT):
    every other measured field, the model's and the global batch included, splits the groups."""
    return frozenset(f.name for f in measured(cls) if _meta(f, "same_loss"))


def per_world(cls: type = RunConfig) -> frozenset[str]:
    """Measured fields a scaling base may differ in from the runs it is the base of
    (suite/analyze/groups.py BASE_EXCEPT): they follow the world size at a fixed global batch."""
    return frozenset(f.name for f in measured(cls) if _meta(f, "per_world"))


def changes_loss(cls: type = RunConfig) -> dict[str, Any]:
    """Measured fields whose values follow different loss curves by design (float8, a compressing
    DDP hook), each with the default its other values are compared against (suite/analyze/losscheck.py
    drifts)."""
    return {f.name: default(f.name, cls) for f in measured(cls) if _meta(f, "changes_loss")}


def layout(cls: type = RunConfig) -> frozenset[str]:
    """Measured fields that are part of the run's layout beside the strategy (`layout=True`: mesh
    degrees, pipeline, where state lives; suite/analyze/groups.py LAYOUT_KNOBS)."""
    return frozenset(f.name for f in measured(cls) if _meta(f, "layout"))


def record_path(f: Field) -> tuple[str, ...]:
    """Where a record holds the field besides its settings (`record=`, else `column=`, else its
    name at the top): what the trainer says it ran (suite/analyze/groups.py reads it)."""
    return tuple((_meta(f, "record") or column(f)).split("."))


def in_record(record: dict, name: str, cls: type = RunConfig) -> Any:
    """Knob `name` of the run that made a result record: as given in its settings, else (an
    older record) where the trainer wrote it (`record_path`); None where neither holds it."""
    return _reader(field_of(name, cls))(record)


def chart_keys(cls: type = RunConfig, under: str = "") -> dict[str, str]:
    """Field name -> its chart value outside `run:` (`chart_key=`), those under `under.` only
    and without that prefix (chart_keys(under="checkpoint") == {"checkpoint_every": "every", ...})."""
    prefix = f"{under}." if under else ""
    return {f.name: key.removeprefix(prefix) for f in knob_fields(cls)
            if (key := _meta(f, "chart_key")) and key.startswith(prefix)}


def chart_fields(cls: type = RunConfig) -> list[Field]:
    """First-class chart values, in RunConfig's order (the order of their flags)."""
    return [f for f in knob_fields(cls) if _meta(f, "chart")]


def camel(name: str) -> str:
    """micro_batch -> microBatch (the chart's value names)."""
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def base_type(cls: type, name: str) -> Any:
    """int, float, bool, str, or the Literal, with Optional stripped."""
    kind = typing.get_type_hints(cls)[name]
    if typing.get_origin(kind) is Literal:
        return kind
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


def is_numeric(cls: type, name: str) -> bool:
    return base_type(cls, name) in (int, float)


def csv_columns(have: set[str], cls: type = RunConfig) -> list[tuple[str, str, Callable[[dict], Any]]]:
    """(column, description, reader) for every measured knob the CSV does not have yet: read from
    the record's `settings`, else (older records) where the record holds it (`record_path`)."""
    docs = field_docs(cls)
    out = []
    for f in measured(cls):
        name = column(f)
        if name not in have:
            out.append((name, docs.get(f.name, "").split(". ")[0], _reader(f)))
    return out


def _reader(f: Field) -> Callable[[dict], Any]:
    name, path = f.name, record_path(f)

    def get(record: dict) -> Any:
        given = record.get("settings")
        if isinstance(given, dict) and name in given:
            return given[name]
        value: Any = record
        for key in path:  # an older record: where the trainer wrote it (`record=`)
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return value
    return get


def command_line(cfg: Any, first: typing.Iterable[str] = (), skip: typing.Iterable[str] = ()) -> list[str]:
    """The trainer's command line for `cfg`: the fields in `first` always (in that order), then
    every other knob whose value is not RunConfig's default, in declaration order (less `skip`).
    trainer.config.parse_args of it gives `cfg` back; the one generator of trainer arguments."""
    first, skip = list(first), set(skip)
    rest = [f.name for f in knob_fields(type(cfg)) if f.name not in first and f.name not in skip
            and getattr(cfg, f.name) != default(f.name, type(cfg))]
    return to_argv(cfg, first + rest)


def chart_run_values(cfg: Any) -> dict[str, Any]:
    """The chart's `run:` values of the first-class knobs."""
    return {camel(f.name): getattr(cfg, f.name) for f in chart_fields(type(cfg))}


__all__ = ["SUITE_SET", "base_type", "by_section", "camel", "chart_fields", "chart_run_values", "column",
           "command_line", "csv_columns", "default", "field_of", "in_record", "is_numeric", "knob_fields",
           "measured", "per_world", "same_loss", "section", "settings"]
