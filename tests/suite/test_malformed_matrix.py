"""Hostile matrix files (issue 19): an alias bomb hung --dry-run while memory grew; deep nesting,
an anchor that contains itself and NUL bytes ended in tracebacks. Each must be one line on
stderr and exit 2, at once (real `shardbench run --dry-run` processes)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardbench.suite.matrix import safe_yaml

REPO = Path(__file__).resolve().parents[2]


def _bomb() -> str:
    lines = ['a0: &a0 ["ddp","ddp","ddp","ddp","ddp","ddp","ddp","ddp","ddp"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    return "overrides:\n" + "\n".join("  " + line for line in lines) + "\nstrategies: *a8\n"


HOSTILE = {
    "alias-bomb": _bomb(),
    "deep-nesting": "results: " + "[" * 5000 + "]" * 5000 + "\n",
    "nesting-past-the-limit": "results: " + "[" * 40 + "]" * 40 + "\n",
    "self-referencing-anchor": "strategies: &s [ddp, *s]\n",
    "self-referencing-mapping": "overrides: &o {lr: 0.1, again: *o}\n",
    "nul-byte": "strategies: [ddp]\nresults: res\0ults\n",
    "escaped-nul-in-results": 'strategies: [ddp]\nresults: "res\\0ults"\n',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_matrix_is_one_line_and_exit_2(tmp_path, name):
    path = tmp_path / "m.yaml"
    path.write_bytes(HOSTILE[name].encode())
    assert len(HOSTILE[name]) < 12_000
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path), "--dry-run"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0], proc.stderr[-2000:]


def test_anchors_within_bounds_still_load():
    data = safe_yaml.load("base: &b [1, 2]\nworld_sizes: *b\nseq_lens: *b\n", "m.yaml")
    assert data == {"base": [1, 2], "world_sizes": [1, 2], "seq_lens": [1, 2]}


def test_a_set_value_is_bounded_too():
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--dry-run", "--set", "lr=&x [*x]"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    # argparse's own usage lines come first, as for any bad flag; then the one line of the problem.
    assert proc.returncode == 2 and "contains itself" in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


MALFORMED = {  # name -> (file bytes, what the one line must say besides the file)
    "100k-char-shape": (b"strategies: [ddp]\nshape: " + b"a" * 100_000 + b"\n", "is not a shape name"),
    "5000-digit-int": (b"strategies: [ddp]\nmicro_batch: " + b"9" * 5000 + b"\n", "micro_batch on line 2"),
    "bad-utf8": (b'strategies: [ddp]\nresults: "r\xff\xfe"\n', "not UTF-8 text (byte 0xff on line 2)"),
    "20000-item-list": (b"strategies: [ddp]\nworld_sizes: [" + b",".join([b"1"] * 20_000) + b"]\n",
                        "more than 10000 values under world_sizes"),
    "huge-micro-batch": (b"strategies: [ddp]\nmicro_batch: " + b"1" + b"0" * 30 + b"\n", "micro_batch must be at most"),
    "huge-n-embd": (b"strategies: [ddp]\nn_embd: " + b"1" + b"0" * 30 + b"\n", "n_embd must be at most"),
    "huge-seed": (b"strategies: [ddp]\nseed: " + b"1" + b"0" * 30 + b"\n", "seed must be at most"),
    "results-like-a-flag": (b"strategies: [ddp]\nresults: --help\n", "starts with '-'"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_values_are_one_line_naming_the_problem_and_exit_2(tmp_path, name):
    """Each was a traceback, a line without the file or key, a silent replacement, the wrong
    reason, or a dry run that passed (issue 35 item 5)."""
    content, says = MALFORMED[name]
    path = tmp_path / "m.yaml"
    path.write_bytes(content)
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path), "--dry-run",
                           "--no-plan"], cwd=REPO, capture_output=True, text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and says in lines[0], proc.stderr[-2000:]
    assert str(path) in lines[0], lines[0]  # the knob bounds' lines named no file (issue 35 item 5)


def test_a_bound_names_the_file_only_for_a_value_the_file_set(tmp_path):
    """A value under `overrides:` names the file too; one a flag set (or overrode) does not."""
    path = tmp_path / "m.yaml"
    path.write_text("strategies: [ddp]\nmicro_batch: 100000\noverrides:\n  n_embd: [64, 100000]\n")
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path), "--dry-run",
                           "--no-plan", "--set", "seed=99999999999"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and sorted(lines) == [
        f"shardbench: invalid matrix: {path}: micro_batch must be at most 65536, got 100000",
        f"shardbench: invalid matrix: {path}: n_embd must be at most 65536, got 100000",
        "shardbench: invalid matrix: seed must be at most 2147483647, got 99999999999"], proc.stderr[-2000:]
    over = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path), "--dry-run",
                           "--no-plan", "--micro-batch", "70000", "--set", "n_embd=64"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert over.returncode == 2 and over.stderr.strip().splitlines() == [
        "shardbench: invalid matrix: micro_batch must be at most 65536, got 70000"], over.stderr[-2000:]


def _text_knobs() -> list[str]:
    """The matrix keys whose value is free text that reaches the trainer's command line."""
    import typing

    from shardbench.suite.matrix.specs import KNOB_KEYS
    from shardbench.trainer.config import RunConfig

    hints = typing.get_type_hints(RunConfig)
    return sorted(k for k in KNOB_KEYS if typing.get_origin(hints[k]) is not typing.Literal
                  and str in (typing.get_args(hints[k]) or (hints[k],)))


@pytest.mark.parametrize("where", ["file", "flag"])
def test_every_text_value_like_a_flag_is_refused_in_the_dry_run(tmp_path, where):
    """Issue 35: `results: --help` passed the dry run and every run then failed with "expected one
    argument"; only results was checked. Every text knob (from RunConfig's types, not a list here),
    set in the file or by a flag, is one line naming its key, exit 2."""
    names = _text_knobs() + ["shape", "launcher", "results"]  # the suite's own that reach it too
    assert {"deepspeed_config", "resume_allow"} <= set(names)
    path = tmp_path / "m.yaml"
    for name in names:
        path.write_text("strategies: [zero2]\nworld_sizes: [1]\n" + (f"{name}: --help\n" if where == "file" else ""))
        given = ([] if name == "results" else ["--results", str(tmp_path / "r")]) \
            + ([] if where == "file" else [f"--{name.replace('_', '-')}=--help"])
        proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--matrix", str(path),
                               "--dry-run", "--no-plan", *given], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (name, proc.stderr[-2000:])
        assert f"{name} " in lines[0] and "'--help'" in lines[0], lines[0]  # the key, the value as written
    assert not (tmp_path / "r").exists()
