"""The one generator of command-line flags from a dataclass: each field a `--flag` (underscores
become dashes), its docstring the help, a `Literal[...]` the choices, a bool an on/off switch
(`--x/--no-x`), int and float typed, a list comma-separated. The trainer's flags (RunConfig), the
suite's matrix flags (MatrixSpec and every knob) and the cluster flags (ClusterOptions) all come
from here; trainer.knobs.command_line is the way back from a RunConfig to its flags. Torch-free.
"""
from __future__ import annotations

import argparse
import types
import typing
from dataclasses import MISSING, Field, fields
from typing import Any, Callable, Iterable, Literal, Sequence

from shardbench.trainer.contract import flag
from shardbench.trainer.fielddocs import field_docs


def comma_list(kind: type) -> Callable[[str], list]:
    """'1, 2,4' -> [1, 2, 4] (kind int), 'ddp,zero3' -> ['ddp', 'zero3']."""
    def parse(text: str) -> list:
        try:
            return [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            what = "integers" if kind is int else f"{kind.__name__} values"
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
    return parse


def _default(f: Field) -> Any:
    return f.default if f.default is not MISSING else None


_BOUNDS = (("min", ">= {}"), ("above", "> {}"), ("max", "<= {}"), ("below", "< {}"))
"""knob() bounds (trainer/config.py) as the help shows them."""


def argument(f: Field, kind: Any, doc: str, *, defaults: bool = True, value_type: Callable | None = None,
             dest: str | None = None, help_suffix: str = "") -> dict[str, Any]:
    """argparse keywords for one field. defaults=False: every flag defaults to None (it overrides
    something only when given). value_type: one parser for every value (e.g. YAML)."""
    default = _default(f) if defaults else None
    args = typing.get_args(kind)
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
    base = next((a for a in args if a is not type(None)), kind) if optional else kind
    shown = "" if default is None or not defaults else f" (default: {default})"
    bounds = ", ".join(text.format(f.metadata[key]) for key, text in _BOUNDS if f.metadata.get(key) is not None)
    spec: dict[str, Any] = {"dest": dest or f.name, "default": default,
                            "help": (doc + help_suffix + (f" [{bounds}]" if bounds else "") + shown).replace("%", "%%")}
    if defaults and f.default is MISSING and f.default_factory is MISSING:
        spec["required"] = True
    if value_type is not None:
        spec.update(type=value_type, metavar="VALUE")
    elif typing.get_origin(kind) is Literal:
        spec.update(choices=args, metavar="{" + ",".join(map(str, args)) + "}")
    elif base is bool:
        spec["action"] = argparse.BooleanOptionalAction
    elif base in (int, float):
        spec.update(type=base, metavar="N" if base is int else "X")
    elif typing.get_origin(base) is list:
        item = (typing.get_args(base) or (str,))[0]
        spec.update(type=comma_list(item), metavar="A,B")
    else:
        spec["metavar"] = "TEXT"
    return spec


def add_flags(parser, cls: type, *, names: Iterable[str] | None = None, defaults: bool = True,
              value_type: Callable | None = None, dest: Callable[[str], str] | None = None,
              help_suffix: str = "", sections: Sequence[str] = (), section_title: str = "{}") -> None:
    """One flag per field of `cls` (only `names`, when given) on `parser` (or an argument group).
    sections: group the flags in argument groups by each field's `section` metadata, in this
    order (titled section_title.format(section)); fields of no listed section stay on `parser`."""
    hints, docs = typing.get_type_hints(cls), field_docs(cls)
    wanted = None if names is None else set(names)
    chosen = [f for f in fields(cls) if wanted is None or f.name in wanted]
    order = {name: i for i, name in enumerate(sections)}
    groups = {name: parser.add_argument_group(section_title.format(name)) for name in sections
              if any(f.metadata.get("section") == name for f in chosen)}
    def section(f: Field) -> str:
        return f.metadata.get("section") or ""

    for f in sorted(chosen, key=lambda f: order.get(section(f), len(order))):
        target = groups.get(section(f), parser)
        target.add_argument(flag(f.name), **argument(f, hints[f.name], docs.get(f.name, ""), defaults=defaults,
                                                     value_type=value_type, dest=dest(f.name) if dest else None,
                                                     help_suffix=help_suffix))
