"""Issue 27 item 4: no command restates a run knob's flag. `shardbench run`, `plan` and `tune`
take every knob a matrix may set, generated from trainer/config.py (trainer/flags.py add_flags
through suite/cli/matrix_flags.py), with the same spelling, type and choices; `report`, `compare`,
`collect` and benchtui take result sets, logs and the suite's own settings, never a run knob, so
none of theirs is hand-written."""
from __future__ import annotations

import argparse
from dataclasses import fields

from shardbench.suite.cli.commands import build_parser
from shardbench.suite.matrix.expand import KNOB_KEYS, MatrixSpec
from shardbench.trainer import knobs
from shardbench.trainer.flags import flag
from shardbench.tui.app import main as tui_main

RUN_FIELDS = {f.name for f in knobs.knob_fields()}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _knob_actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's flags spelled as a RunConfig field: option string -> action."""
    return {o: a for a in parser._actions for o in a.option_strings if o[2:].replace("-", "_") in RUN_FIELDS}


def _shape(a: argparse.Action) -> tuple:
    return (type(a).__name__, tuple(a.option_strings), a.dest, a.nargs, a.const, a.choices, a.type, a.default)


def test_run_plan_and_tune_take_every_knob_as_declared():
    parsers = _subparsers()
    run = _knob_actions(parsers["run"])
    matrix_fields = {f.name for f in fields(MatrixSpec)} & RUN_FIELDS  # shape, launcher: the matrix's own
    assert {o for o in run if not o.startswith("--no-")} == {flag(n) for n in KNOB_KEYS | matrix_fields}
    for name in ("plan", "tune"):
        theirs = _knob_actions(parsers[name])
        # plan also spells its axes singular (--strategy, --seq-len): not knobs a matrix sets
        extra = {"--strategy", "--seq-len"} if name == "plan" else set()
        assert set(theirs) - extra == set(run), name
        assert {o: _shape(a) for o, a in theirs.items() if o not in extra} == {o: _shape(a) for o, a in run.items()}


def test_report_compare_collect_and_benchtui_take_no_run_knob(monkeypatch):
    parsers = _subparsers()
    knob_flags = {flag(n) for n in KNOB_KEYS}
    for name in ("report", "compare", "collect"):
        assert not set(_knob_actions(parsers[name])) & knob_flags, name
    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def keep(self, args=None, namespace=None):
        captured.append(self)
        return original(self, args, namespace)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", keep)
    tui_main.parse_args([])
    assert len(captured) == 1 and not set(_knob_actions(captured[0])) & knob_flags
