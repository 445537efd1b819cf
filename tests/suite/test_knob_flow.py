"""A new knob is one RunConfig field (trainer/config.py) and nothing else: in a copy of this
checkout whose only change is one new field, the knob is a trainer flag, a `shardbench run` flag,
a matrix key that sweeps, part of the config id, a chart value with its flag (after the chart's
generator is run), a key of the record's settings (from a real trainer run), a metrics.csv column
and a key of the loss groups and scaling bases. Before trainer/knobs.py a knob like this touched
about 13 files (issue 17)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HELM = REPO / ".tools" / "helm3" / "helm"
FIELD = '''    throwaway_knob: int = knob(3, section="optimizer", min=1, max=9, chart=True, record="optimizer.throwaway_knob")
    """A knob that exists only in tests/suite/test_knob_flow.py's copy of the checkout."""
    throwaway_degree: int = knob(1, section="parallelism", min=1, layout=True)
    """A layout knob that exists only there."""
    throwaway_every: int = knob(0, section="checkpoint", min=0, chart_key="checkpoint.throwawayEvery")
    """A knob a chart value outside run: carries, only there."""
'''
ANCHOR = '    """Seeds the initial weights and the synthetic tokens: same seed, same run."""\n'


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    """This checkout's code, chart and values with one field added to RunConfig."""
    root = tmp_path_factory.mktemp("knob") / "repo"
    # shardbench/ holds relative symlinks (shardbench/trainer -> ../trainer): copied as links, the
    # copy on PYTHONPATH imports its own code.
    for part in ("shardbench", "trainer", "suite", "tui", "chart", "scripts", "values", "docs"):
        shutil.copytree(REPO / part, root / part, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "__snapshots__"))
    config = root / "trainer" / "config.py"
    text = config.read_text()
    assert text.count(ANCHOR) == 1
    config.write_text(text.replace(ANCHOR, ANCHOR + FIELD))
    return root


def py(copy: Path, code: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONWARNINGS": "ignore::FutureWarning",
           "SHARDBENCH_VALUES_DIR": str(copy / "values")}
    return subprocess.run([sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_only_config_py_differs(copy):
    changed = [p.relative_to(copy) for p in copy.rglob("*.py")
               if (REPO / p.relative_to(copy)).read_text() != p.read_text()]
    assert changed == [Path("trainer/config.py")]


def test_a_new_field_is_a_flag_a_matrix_axis_and_a_chart_value(copy):
    proc = py(copy, """
        from shardbench.trainer.config import build_parser
        from shardbench.suite.matrix.expand import matrix_from_dict, expand
        from shardbench.suite.backends.kube.values import run_overrides
        parser = build_parser()
        helps = {a.dest: a.help for a in parser._actions}
        assert "A knob that exists only" in helps["throwaway_knob"] and "(default: 3)" in helps["throwaway_knob"]
        assert "[>= 1, <= 9]" in helps["throwaway_knob"]
        group = next(g for g in parser._action_groups if any(a.dest == "throwaway_knob" for a in g._group_actions))
        assert group.title == "optimizer options"
        specs, errors = expand(matrix_from_dict({"strategies": ["ddp"], "world_sizes": [1], "throwaway_knob": [2, 3]}))
        assert errors == [] and len(specs) == 2 and specs[0].config_id != specs[1].config_id, errors
        args = specs[1].trainer_args()
        assert args[args.index("--throwaway-knob") + 1] == "3", args
        assert run_overrides(specs[1])["run"]["throwawayKnob"] == 3
        _, errors = expand(matrix_from_dict({"strategies": ["ddp"], "world_sizes": [1], "throwaway_knob": 0}))
        assert errors == ["throwaway_knob must be at least 1, got 0"], errors
        _, errors = expand(matrix_from_dict({"strategies": ["ddp"], "world_sizes": [1], "throwaway_knob": 10}))
        assert errors == ["throwaway_knob must be at most 9, got 10"], errors
        from shardbench.trainer import knobs
        assert [f.name for f in knobs.by_section()["optimizer"]][:2] == ["throwaway_knob", "lr"]  # declared after seed
    """)
    assert proc.returncode == 0, proc.stderr
    cli = py(copy, "", "-m", "shardbench.suite.cli", "run", "--dry-run", "--strategies", "ddp", "--world-sizes", "1",
             "--repeats", "1", "--throwaway-knob", "5")
    assert cli.returncode == 0 and "--throwaway-knob 5" in cli.stdout, cli.stderr
    bad = py(copy, "", "-m", "shardbench.suite.cli", "run", "--dry-run", "--strategies", "ddp", "--world-sizes", "1",
             "--repeats", "1", "--throwaway-knob", "10")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "shardbench: invalid matrix: throwaway_knob must be at most 9, got 10"], bad.stderr
    trainer = py(copy, "", "-m", "shardbench.trainer", "--strategy", "ddp", "--throwaway-knob", "10")
    assert trainer.returncode == 2 and "--throwaway-knob must be at most 9, got 10" in trainer.stderr
    helps = py(copy, "", "-m", "shardbench.suite.cli", "run", "--help")
    assert "trainer knobs: optimizer" in helps.stdout and "--throwaway-knob" in helps.stdout


def test_every_knob_name_set_of_the_suite_derives_it(copy, tmp_path):
    """Issue 27 item 4: the suite's sets of knob names (values files' run keys, where a record
    holds a knob, the layout knobs verdicts compare across, a `layouts:` entry's keys, the chart's
    checkpoint values) follow the declaration's metadata, so a new knob needs no second edit."""
    values = tmp_path / "values"
    values.mkdir()
    shutil.copy(copy / "values" / "cpu.yaml", values)  # a matrix's default shape
    (values / "tiny.yaml").write_text("shape: {gpusPerNode: 8}\nrun: {throwawayKnob: 5, seqLen: 32}\n")
    proc = py(copy, f"""
        import os
        os.environ["SHARDBENCH_VALUES_DIR"] = {str(values)!r}
        from shardbench.suite.matrix import expand as matrix
        from shardbench.suite.analyze import groups
        from shardbench.suite.analyze.analysis import MeasuredConfig
        from shardbench.suite.backends.kube import values
        assert matrix.SHAPE_RUN_KEYS["throwawayKnob"] == "throwaway_knob"
        assert matrix.load_shape("tiny").run == {{"throwaway_knob": 5, "seq_lens": [32]}}
        assert groups._RECORD_PATH["throwaway_knob"] == ("optimizer", "throwaway_knob")
        assert groups.settings({{"optimizer": {{"throwaway_knob": 6}}}})["throwaway_knob"] == 6
        from shardbench.trainer import knobs
        (read,) = [r for name, _, r in knobs.csv_columns(set()) if name == "throwaway_knob"]
        assert read({{"optimizer": {{"throwaway_knob": 6}}}}) == 6  # an older record's CSV column
        assert "throwaway_degree" in groups.LAYOUT_KNOBS and "throwaway_degree" in groups.VERDICT_EXCEPT
        assert "throwaway_knob" not in groups.VERDICT_EXCEPT
        c = MeasuredConfig({{"strategy": "ddp", "world_size": 2}}, ["r"], settings={{"throwaway_degree": 1}})
        assert c.strategy == "ddp"  # at its default: the preset's own name
        assert "throwaway_degree" in matrix.LAYOUT_KEYS
        (spec,), errors = matrix.expand(matrix.matrix_from_dict({{"strategies": ["ddp"], "world_sizes": [1],
            "layouts": [{{"strategy": "ddp", "throwaway_degree": 2}}], "throwaway_degree": [1, 2]}}))
        assert errors == [] and spec.config.throwaway_degree == 2, errors
        assert values.CHART_CHECKPOINT_KNOBS["throwaway_every"] == "throwawayEvery"
        (spec,), errors = matrix.expand(matrix.matrix_from_dict({{"strategies": ["ddp"], "world_sizes": [1],
                                                                  "checkpoint_every": 2, "throwaway_every": 4}}))
        out = values.run_overrides(spec)
        assert out["checkpoint"] == {{"enabled": True, "every": 2, "throwawayEvery": 4}}, out
        assert "--throwaway-every" not in out["run"]["extraArgs"], out
    """)
    assert proc.returncode == 0, proc.stderr


def test_the_knob_docs_generator_picks_it_up(copy):
    stale = py(copy, "", "scripts/gen_knob_docs.py", "--check")
    assert stale.returncode == 1 and "docs/knobs.md is out of date" in stale.stderr
    assert py(copy, "", "scripts/gen_knob_docs.py").returncode == 0
    text = (copy / "docs" / "knobs.md").read_text()
    optimizer = text.split("## optimizer")[1].split("## ")[0]
    assert "| `--throwaway-knob` | int | `3` | >= 1, <= 9 | chart | A knob that exists only" in optimizer


def test_the_chart_generator_picks_it_up(copy):
    stale = py(copy, "", "scripts/gen_chart_contract.py", "--check")
    assert stale.returncode == 1 and "contract.json is out of date" in stale.stderr
    assert py(copy, "", "scripts/gen_chart_contract.py").returncode == 0
    contract = json.loads((copy / "chart" / "files" / "contract.json").read_text())
    assert {"value": "throwawayKnob", "flag": "--throwaway-knob", "noFlag": "--no-throwaway-knob",
            "type": "integer"} in contract["runFlags"]
    schema = json.loads((copy / "chart" / "values.schema.json").read_text())
    assert schema["properties"]["run"]["properties"]["throwawayKnob"] == {"type": "integer", "minimum": 1,
                                                                          "maximum": 9}
    assert HELM.is_file(), "helm missing: run scripts/install-tools.sh (make test does)"
    for sets, want in (((), None), (("--set", "run.throwawayKnob=5"), "5")):
        out = subprocess.run([str(HELM), "template", "sb", str(copy / "chart"), *sets], capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        job = next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "MPIJob")
        args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
        if want is None:  # not in values.yaml: the trainer's own default
            assert "--throwaway-knob" not in args
        else:
            assert args[args.index("--throwaway-knob") + 1] == want
    over = subprocess.run([str(HELM), "template", "sb", str(copy / "chart"), "--set", "run.throwawayKnob=10"],
                          capture_output=True, text=True, timeout=120)
    assert over.returncode != 0 and "throwawayKnob" in over.stderr and "maximum" in over.stderr, over.stderr


@pytest.mark.slow
def test_a_real_run_records_it_and_the_csv_compares_on_it(copy, tmp_path):
    out = tmp_path / "run"
    run = py(copy, "", "-m", "shardbench.trainer", "--strategy", "ddp", "--seq-len", "16", "--steps", "3",
             "--warmup-steps", "1", "--device", "cpu", "--throwaway-knob", "7", "--output-dir", str(out),
             timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads((out / "result.json").read_text())
    assert record["settings"]["throwaway_knob"] == 7
    names = list(record["settings"])  # listed section by section: the optimizer's knobs together
    assert names[names.index("throwaway_knob"):names.index("adam_eps") + 1] == [
        "throwaway_knob", "lr", "weight_decay", "grad_clip", "lr_warmup_steps", "adam_beta1", "adam_beta2", "adam_eps"]
    proc = py(copy, f"""
        import json
        from shardbench.suite.analyze import groups
        from shardbench.suite.analyze import rows as metrics
        record = json.load(open({str(out / 'result.json')!r}))
        df = metrics.to_frame([record])
        assert df.loc[0, "throwaway_knob"] == 7
        other = json.loads(json.dumps(record))
        other["settings"]["throwaway_knob"] = 8
        mine, theirs = groups.settings(record), groups.settings(other)
        assert mine["throwaway_knob"] == 7
        assert groups.loss_key(mine) != groups.loss_key(theirs) and groups.base_key(mine) != groups.base_key(theirs)
        path = metrics.write_csv(df, {str(tmp_path / 'metrics.csv')!r})
        assert "throwaway_knob" in open(path).readline().split(",")
    """)
    assert proc.returncode == 0, proc.stderr
