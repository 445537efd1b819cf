"""Issue 32 item 10: a read-only --results is refused before any planning or run; --dry-run says
what --force would re-measure; compare's re-measure hint is a whole command."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.suite.cli.commands import build_parser, main
from shardbench.suite.cli.matrix_flags import effective_matrix
from shardbench.suite.matrix.expand import expand
from tests.fsfaults import tmpfs
from tests.suite.test_runner import finish

ARGS = ["--strategies", "ddp", "--world-sizes", "1,2", "--repeats", "1", "--device", "cpu", "--precision", "fp32"]


def test_a_read_only_results_dir_is_refused_before_planning(tmp_path, monkeypatch, capsys):
    import shardbench.suite.matrix.planning as planning

    def no_planning(*_a, **_k):
        raise AssertionError("planned before the results dir was checked")

    monkeypatch.setattr(planning, "predict_specs", no_planning)
    with tmpfs(tmp_path / "ro", readonly=True) as results:
        code = main(["run", "--results", str(results), *ARGS, "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "is unusable" in err[0] and "--results" in err[0], err


def test_dry_run_says_what_force_would_re_measure(tmp_path, capsys):
    specs, errors = expand(effective_matrix(build_parser().parse_args(["run", "--results", str(tmp_path), *ARGS])))
    assert not errors
    finish(tmp_path, specs[0])
    assert main(["run", "--results", str(tmp_path), *ARGS, "--dry-run"]) == 0
    out = capsys.readouterr()
    lines = {line.split()[0]: line for line in out.out.splitlines()}
    assert lines[specs[0].run_id].endswith("[skip: done, kept]") and "[" not in lines[specs[1].run_id]
    assert "1 run, 1 skip (done)" in out.err
    assert main(["run", "--results", str(tmp_path), *ARGS, "--dry-run", "--force"]) == 0
    out = capsys.readouterr()
    lines = {line.split()[0]: line for line in out.out.splitlines()}
    assert lines[specs[0].run_id].endswith("[re-measure: its result moves to attempts/]")
    assert main(["run", "--results", str(tmp_path), *ARGS, "--dry-run", "--force", "nope"]) == 2


def test_compare_hint_is_a_whole_command(tmp_path):
    from shardbench.suite.cli.compare import compare_dirs, text
    from tests.synthetic import record

    def side(name: str, load: float) -> Path:
        d = tmp_path / name
        for i, tps in enumerate([1000.0, 1010.0, 990.0]):
            r = record("ddp", 2, tps, repeat=i, cpu_count=2, load_avg_1m_start=load, load_avg_1m_end=load)
            (d / r["run_id"]).mkdir(parents=True)
            (d / r["run_id"] / "result.json").write_text(json.dumps(r))
        return d

    out = text(compare_dirs(side("a", 0.5), side("b", 12.0)))
    assert f"shardbench run --matrix MATRIX.yaml --results {tmp_path / 'b'} --rerun-flagged" in out
    assert f"--results {tmp_path / 'a'}" not in out
