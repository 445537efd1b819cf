"""Between the Matrix screen's fields (strings) and the suite's MatrixSpec.

Pure functions: `to_matrix` turns field values into a MatrixSpec or says which field is wrong;
`from_matrix` gives the field values of a loaded MatrixSpec; `shapes` lists values/*.yaml.
"""
from __future__ import annotations

from dataclasses import asdict, fields as dataclass_fields
from pathlib import Path
from typing import Any

from shardbench.suite.matrix.expand import MatrixSpec, matrix_from_dict, values_dir

INT_LIST_FIELDS = ("world_sizes", "seq_lens")
DEGREE_FIELDS = ("tp", "dp_replicate")
"""Mesh degrees (trainer knobs): one number, or a list that sweeps them ("1, 2")."""
INT_FIELDS = ("micro_batch", "grad_accum", "global_batch", "steps", "warmup_steps", "repeats")
OPTIONAL_INT_FIELDS = ("grad_accum", "global_batch")
CHOICE_FIELDS = ("model", "precision", "launcher", "shape", "backend")
EXTRA_FIELDS = tuple(f.name for f in dataclass_fields(MatrixSpec)
                     if f.name not in ("strategies", *INT_LIST_FIELDS, *INT_FIELDS, *CHOICE_FIELDS, *DEGREE_FIELDS))
"""Matrix keys without a widget (timeout, device, seed, results, trainer options...): kept as
loaded, so saving a matrix never drops them."""


def int_list(text: str) -> list[int]:
    """'1, 2 4' -> [1, 2, 4]; raises ValueError naming the bad item."""
    items = [t for t in text.replace(",", " ").split() if t]
    out = []
    for item in items:
        try:
            out.append(int(item))
        except ValueError:
            raise ValueError(f"{item!r} is not a whole number") from None
    return out


def to_matrix(fields: dict[str, Any]) -> tuple[MatrixSpec | None, list[str]]:
    """(MatrixSpec, []) or (None, one line per field that does not parse)."""
    data: dict[str, Any] = {}
    errors: list[str] = []
    data["strategies"] = list(fields.get("strategies") or [])
    for name in INT_LIST_FIELDS:
        try:
            data[name] = int_list(str(fields.get(name, "")))
        except ValueError as exc:
            errors.append(f"{name.replace('_', ' ')}: {exc}")
    for name in DEGREE_FIELDS:
        try:
            values = int_list(str(fields.get(name, "") or ""))
        except ValueError as exc:
            errors.append(f"{name.replace('_', ' ')}: {exc}")
            continue
        if values:  # empty: the knob's default (1)
            data[name] = values[0] if len(values) == 1 else values
    for name in INT_FIELDS:
        text = str(fields.get(name, "") or "").strip()
        if not text and name in OPTIONAL_INT_FIELDS:
            data[name] = None
            continue
        try:
            data[name] = int(text)
        except ValueError:
            errors.append(f"{name.replace('_', ' ')}: {text!r} is not a whole number")
    for name in CHOICE_FIELDS:
        if fields.get(name) is not None:
            data[name] = fields[name]
    for name in EXTRA_FIELDS:
        if name in fields:
            data[name] = fields[name]
    if errors:
        return None, errors
    try:
        return matrix_from_dict(data), []
    except (TypeError, ValueError) as exc:
        return None, [str(exc)]


def from_matrix(spec: MatrixSpec) -> dict[str, Any]:
    """Field values (strings for inputs) showing `spec`; a knob it does not set shows RunConfig's
    default (MatrixSpec reads it through)."""
    data = {**asdict(spec), **{k: getattr(spec, k) for k in (*INT_FIELDS, *CHOICE_FIELDS)}}
    out: dict[str, Any] = {k: data[k] for k in ("strategies", *CHOICE_FIELDS, *EXTRA_FIELDS)}
    for name in INT_LIST_FIELDS:
        out[name] = ", ".join(str(v) for v in data[name])
    for name in INT_FIELDS:
        out[name] = "" if data[name] is None else str(data[name])
    for name in DEGREE_FIELDS:
        value = getattr(spec, name)
        out[name] = ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)
    return out


def shapes(directory: Path | None = None) -> list[str]:
    """Shape names = values/<name>.yaml files found."""
    directory = directory or values_dir()
    return sorted(p.stem for p in directory.glob("*.yaml")) if directory.is_dir() else []
