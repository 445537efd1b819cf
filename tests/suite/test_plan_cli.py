"""`shardbench plan` takes the flags of `shardbench run` (generated from the same RunConfig and
MatrixSpec, trainer/flags.py) and expands and validates the matrix as run does: every
configuration run can make can be planned, bad input is one line and exit 2 (nothing silently
replaced), and --calibrate takes only a world-size-1 run of the planned configuration."""
from __future__ import annotations

import json

import pytest

from shardbench.suite.cli.commands import build_parser, main

SMALL = ["--strategies", "ddp", "--world-sizes", "2", "--model", "tiny", "--n-layer", "1", "--seq-len", "16",
         "--micro-batch", "1"]


def _code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own errors (one line: the plan parser's error())
        return int(exc.code)


@pytest.mark.parametrize("argv,says", [
    (["--grad-accum", "-1"], "grad_accum must be at least 1"),
    (["--seq-len", "0"], "seq_len must be at least 1"),
    (["--micro-batch", "0"], "micro_batch must be at least 1"),
    (["--strategy", "zero9"], "zero9"),
    (["--strategies", "ddp,zero9"], "zero9"),
    (["--world-size", "two"], "--world-size"),
    (["--world-sizes", "0"], "world size must be a positive integer"),
    (["--shape", "nosuch"], "nosuch"),
    (["--precision", "fp17"], "fp17"),
    (["--bucket-mib", "0"], "bucket_mib must be above 0"),
    (["--n-embd", "100", "--n-head", "3"], "not divisible"),
    (["--calibrate", "/nonexistent/results"], "no such results directory"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, says):
    assert _code(["plan", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert err[0].startswith("shardbench plan: ")


def _options(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {o for action in sub.choices[command]._actions for o in action.option_strings}


def test_plan_accepts_every_flag_that_configures_a_run():
    """Every knob and matrix flag of run (both spellings of the axes); run's own execution flags
    (force, mlflow, cluster access...) configure no run and are left out."""
    from shardbench.suite.backends import add_cluster_flags

    import argparse

    cluster = argparse.ArgumentParser()
    add_cluster_flags(cluster)
    execution = {o for a in cluster._actions for o in a.option_strings} | {
        "--force", "--rerun-flagged", "--order-seed", "--yes", "--dry-run", "--save-matrix", "--report", "--quiet",
        "--mlflow", "--mlflow-uri", "--mlflow-experiment", "--no-plan", "--strict", "-h", "--help"}
    missing = _options("run") - execution - _options("plan")
    assert missing == set()
    assert {"--strategy", "--world-size", "--seq-len", "--strategies", "--world-sizes", "--seq-lens"} <= _options("plan")


def test_every_knob_reaches_the_plan(capsys):
    """Knobs the old plan had no flag for (model dimensions, buckets, reduce dtype, reshard,
    recompute) reach the planner's input; a swept one plans each value."""
    assert main(["plan", *SMALL, "--n-embd", "64", "--n-head", "2", "--vocab-size", "512", "--bucket-mib", "[1, 4]",
                 "--grad-reduce-dtype", "bf16", "--reshard-after-forward", "false", "--activation-checkpointing", "true",
                 "--grad-accum", "3", "--json"]) == 0
    preds = json.loads(capsys.readouterr().out)
    assert [p["input"]["bucket_mib"] for p in preds] == [1, 4]
    for p in preds:
        i = p["input"]
        assert (i["n_layer"], i["n_embd"], i["n_head"], i["vocab_size"], i["seq_len"], i["micro_batch"]) == \
            (1, 64, 2, 512, 16, 1)
        assert (i["grad_reduce_dtype"], i["reshard_after_forward"], i["activation_checkpointing"], i["grad_accum"]) == \
            ("bf16", False, True, 3)


def _one_rank_record(tmp_path, **over) -> None:
    record = {"run_id": "ddp-w1-s16-mb1-ga1-0000aaaa-r0", "status": "ok", "strategy": "ddp", "world_size": 1,
              "model": {"preset": "tiny", "n_layer": 1}, "seq_len": 16, "micro_batch": 1, "grad_accum": 1,
              "precision": "fp32", "device": "cpu", "tokens_per_s": 1000.0, "flops_per_token": 2e6, **over}
    (tmp_path / record["run_id"]).mkdir()
    (tmp_path / record["run_id"] / "result.json").write_text(json.dumps(record))


def test_calibrate_refuses_another_configurations_one_rank_run(tmp_path, capsys):
    _one_rank_record(tmp_path, micro_batch=8)
    assert main(["plan", *SMALL, "--calibrate", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no ok world-size-1 run of the planned configuration" in err[0], err


def test_calibrate_takes_the_planned_configurations_one_rank_run(tmp_path, capsys):
    _one_rank_record(tmp_path)
    assert main(["plan", *SMALL, "--calibrate", str(tmp_path), "--json"]) == 0
    (p,) = json.loads(capsys.readouterr().out)
    assert p["step_time"]["compute_source"].startswith("calibrated: ddp-w1-s16-mb1-ga1-0000aaaa-r0 (2.00 GFLOP/s")
