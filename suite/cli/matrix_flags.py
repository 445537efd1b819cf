"""What the run and tune commands read from the command line: the matrix flags (one per MatrixSpec
field and trainer knob, plus --set) applied over the matrix file, and `fail`, the one line and
exit 2 of bad input. A module of its own so that commands.py and run_cmd.py share them without
importing each other.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path

from shardbench.trainer.config import SECTIONS, RunConfig
from shardbench.trainer.flags import add_flags

from shardbench.suite.matrix.expand import (DEFAULT_MATRIX, KNOB_KEYS, MatrixSpec, load_matrix, matrix_from_dict,
                                     with_shape_defaults)


def _knob(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as YAML (true, 2, [fp32, bf16])."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    from shardbench.suite.matrix import safe_yaml

    try:
        return key.strip(), safe_yaml.load(value, f"--set {key.strip()}")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _yaml_value(text: str) -> object:
    """A knob's value as YAML (true, 2, [fp32, bf16]); 1e-4, which YAML 1.1 reads as text, a number."""
    from shardbench.suite.matrix import safe_yaml  # bounded aliases, depth, no NUL: one line on bad input

    try:
        value = safe_yaml.load(text, repr(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return [_number(v) for v in value] if isinstance(value, list) else _number(value)


_EXPONENT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+$")


def _number(value: object) -> object:
    """1e-4 as a number (YAML 1.1 wants 1.0e-4); any other text stays text."""
    return float(value) if isinstance(value, str) and _EXPONENT.match(value) else value


def add_matrix_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per MatrixSpec field (lists comma-separated) and per trainer knob (a YAML value: a
    list sweeps it), help from its docstring (trainer.flags); each overrides the matrix file's value."""
    add_flags(parser, MatrixSpec, names=[f.name for f in fields(MatrixSpec) if f.name != "overrides"], defaults=False)
    add_flags(parser, RunConfig, names=KNOB_KEYS, defaults=False, value_type=_yaml_value,
              dest=lambda name: f"knob.{name}", help_suffix=" (trainer knob; a list [a,b] sweeps it)",
              sections=SECTIONS, section_title="trainer knobs: {}")
    parser.add_argument("--set", dest="knobs", type=_knob, action="append", default=[], metavar="KEY=VALUE",
                        help="any trainer knob for every run, e.g. --set activation_checkpointing=true "
                             "(a list sweeps it: --set precision=[fp32,bf16])")


def effective_matrix(args: argparse.Namespace) -> MatrixSpec:
    """The matrix file (default: the default matrix), then every flag given over it."""
    spec = load_matrix(args.matrix or DEFAULT_MATRIX)
    overrides = {f.name: getattr(args, f.name) for f in fields(MatrixSpec)
                 if getattr(args, f.name, None) is not None}
    knob_flags = {name: getattr(args, f"knob.{name}") for name in KNOB_KEYS
                  if getattr(args, f"knob.{name}", None) is not None}
    if overrides.get("shape") in ("", "none"):
        overrides["shape"] = None  # --shape none: hardware unknown (no peak, no price)
    data = {**asdict(spec), **overrides}
    matrix_knobs = data.pop("overrides")  # the matrix file's knobs, as top-level keys again
    if isinstance(data.get("results"), str) and data["results"] and not data["results"].startswith("-"):
        # Resolved once, here: the launchers run in each run's own directory, so a path relative
        # to the user's directory would land elsewhere (in the checkout, once) and lose ZeRO runs.
        data["results"] = os.path.abspath(data["results"])
    matrix = matrix_from_dict({**data, **matrix_knobs, **knob_flags, **dict(args.knobs)})
    explicit = (set(overrides) | set(knob_flags) | set(dict(args.knobs))
                | (set(_keys_of(args.matrix)) if args.matrix else set()))
    return with_shape_defaults(matrix, explicit)


def matrix_file_keys(args: argparse.Namespace) -> set[str]:
    """The keys whose value came from the matrix file (--matrix): those it sets that no flag
    overrides; empty without --matrix. A problem with such a key names the file."""
    if not args.matrix:
        return set()
    flags = ({f.name for f in fields(MatrixSpec) if getattr(args, f.name, None) is not None}
             | {name for name in KNOB_KEYS if getattr(args, f"knob.{name}", None) is not None}
             | set(dict(args.knobs)))
    try:
        return set(_keys_of(args.matrix)) - flags
    except (OSError, ValueError, TypeError):  # load_matrix has read it already: not expected
        return set()


def _keys_of(path: Path) -> list[str]:
    """The keys a matrix file sets itself (load_matrix has already checked it reads)."""
    from shardbench.suite.matrix import safe_yaml

    data = safe_yaml.load(path.read_text(errors="replace"), str(path)) or {}
    return list(data) + list(data.get("overrides") or {})


def fail(message: str) -> int:
    print(f"shardbench: {message}", file=sys.stderr)
    return 2
