"""`shardbench tune` on real runs: two strategies over a small space under a memory limit. The
configuration the planner predicts over the limit is never launched; the best is re-measured
with repeats and reported against the default with intervals; the tuned matrix file expands."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("optuna")

from shardbench.trainer.config import RunConfig  # noqa: E402
from shardbench.suite.cli.commands import main  # noqa: E402
from shardbench.suite.matrix.expand import expand, load_matrix  # noqa: E402
from shardbench.suite.matrix.planning import peak_bytes_per_rank  # noqa: E402
from shardbench.suite.tune.tuner import search_space  # noqa: E402

BASE = ["--world-sizes", "1", "--seq-lens", "32", "--steps", "5", "--warmup-steps", "2", "--micro-batch", "2",
        "--global-batch", "4", "--precision", "fp32", "--device", "cpu", "--shape", "cpu", "--repeats", "2"]


def test_search_space_has_the_batch_axis_and_the_layout_knobs():
    names = {k.name for k in search_space("fsdp", 8)}
    assert {"micro_batch", "activation_checkpointing", "fsdp_grad_sync", "reshard_after_forward"} <= names
    assert [k.values for k in search_space("ddp", 8) if k.name == "micro_batch"] == [(1, 2, 4, 8)]
    assert "fsdp_grad_sync" not in {k.name for k in search_space("ddp", 8)}
    # Only where they act (tests/suite/test_tune_rules.py): FSDP2 has no buckets.
    assert "bucket_mib" not in names and "bucket_mib" in {k.name for k in search_space("zero2", 8)}


def test_grad_accum_is_searched_with_micro_batch_following(tmp_path, capsys):
    """The issue asks tune to search grad-accum too. At the fixed global batch micro-batch x
    grad-accum is the per-rank batch, one axis: `--space grad_accum=[...]` searches it by its
    grad-accum (micro-batch follows). It used to be overwritten by the derived grad-accum, so a
    trial said grad_accum=4 and ran grad-accum 1."""
    from shardbench.suite.matrix.expand import MatrixSpec
    from shardbench.suite.tune.tuner import Tuner

    names = [k.name for k in search_space("ddp", 16, {"grad_accum": [1, 4]})]
    assert "grad_accum" in names and "micro_batch" not in names
    base = MatrixSpec(strategies=["ddp"], world_sizes=[1], seq_lens=[32], micro_batch=16, global_batch=16,
                      steps=5, warmup_steps=2, precision="fp32", device="cpu", shape="cpu")
    tuner = Tuner(base, None, tmp_path, None, 2, 1, {"grad_accum": [1, 4]})
    spec = tuner.spec_for("ddp", {"grad_accum": 4, "activation_checkpointing": False})[0]
    assert (spec.micro_batch, spec.grad_accum, spec.global_batch) == (4, 4, 16)
    assert tuner.default_params("ddp")["grad_accum"] == 1  # the base's micro-batch 16 at 16 per rank
    flags = ["--world-sizes", "1", "--micro-batch", "4", "--global-batch", "8", "--out", str(tmp_path / "t")]
    for space, said in (
            (["grad_accum=[1,2]", "micro_batch=[4]"], "--space: give micro_batch or grad_accum, not both"),
            (["grad_accum=[3]"], "--space grad_accum: [3] do not divide the per-rank batch 8")):
        code = main(["tune", *flags, "--strategies", "ddp", *[x for s in space for x in ("--space", s)]])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and said in err[0], err


@pytest.mark.slow
def test_tune_two_strategies_rejects_over_the_limit_and_remeasures_the_best(tmp_path):
    predict = peak_bytes_per_rank  # the prediction tune itself uses

    def peak(strategy: str, micro_batch: int) -> int:
        return predict(RunConfig(strategy=strategy, seq_len=32, micro_batch=micro_batch, global_batch=4,
                                 precision="fp32", device="cpu"), 1)

    # The planner predicts micro-batch 2 (grad-accum 2: gradients held while the second
    # micro-step's activations live) above micro-batch 4 (grad-accum 1) on this tiny model.
    over = min(peak(s, 2) for s in ("ddp", "fsdp"))
    under = max(peak(s, 4) for s in ("ddp", "fsdp"))
    assert under < over
    limit_gib = (under + over) / 2 / 2**30  # micro-batch 2 is predicted over it, 4 (the default) is not
    base = [*BASE[:BASE.index("--micro-batch")], "--micro-batch", "4", *BASE[BASE.index("--micro-batch") + 2:]]
    out = tmp_path / "tune"
    code = main(["tune", *base, "--strategies", "ddp,fsdp", "--trials", "4", "--out", str(out),
                 "--space", "micro_batch=[2,4]", "--space", "activation_checkpointing=[false]",
                 "--space", "fsdp_grad_sync=[every_micro_step]", "--space", "reshard_after_forward=[true]",
                 "--space", "bucket_mib=[25.0]", "--memory-limit-gib", str(limit_gib)])
    assert code == 0
    studies = {s["strategy"]: s for s in json.loads((out / "tune.json").read_text())}
    for strategy in ("ddp", "fsdp"):
        trials = studies[strategy]["trials"]
        rejected = [t for t in trials if t.get("rejected")]
        assert [t["params"]["micro_batch"] for t in rejected] == [2]
        assert not (out / "trials" / rejected[0]["run_id"]).exists()  # never launched
        assert studies[strategy]["best"]["micro_batch"] == 4
        matrix = load_matrix(out / f"tuned-{strategy}.yaml")
        specs, errors = expand(matrix)
        assert not errors and specs[0].micro_batch == 4 and specs[0].global_batch == 4
        # Re-measured: the repeats of the best configuration are in remeasure/, all ok.
        again = [json.loads(p.read_text()) for p in (out / "remeasure").glob(f"{strategy}-*/result.json")]
        assert len(again) == 2 and all(r["status"] == "ok" for r in again)
    tuning = (out / "TUNING.md").read_text()
    assert "| ddp |" in tuning and "| fsdp |" in tuning and "(n=2)" in tuning
    report = (out / "report" / "BENCHMARK_REPORT.md").read_text()
    assert "## Tuned vs default" in report and "## Launcher start-up" in report
    assert report.count("(n=2)") >= 4  # default and tuned tokens/s of both strategies, with intervals


def test_launcher_startup_and_tuned_sections_from_records(tmp_path):
    from shardbench.suite.report.tune_section import markdown

    def rec(launcher, s, cid, tps):
        return {"status": "ok", "launcher": launcher, "launcher_startup_s": s, "tokens_per_s": tps,
                "run_id": f"ddp-w2-s32-mb4-ga1-{cid}-r0"}

    records = [rec("torchrun", 1.0, "aaaaaaaa", 100.0), rec("torchrun", 1.2, "aaaaaaaa", 110.0),
               rec("ray", 6.0, "bbbbbbbb", 120.0), rec("ray", 7.0, "bbbbbbbb", 130.0)]
    assert "## Tuned vs default" not in markdown(records, tmp_path)
    (tmp_path / "tuning.json").write_text(json.dumps({"ddp": {
        "default": {"config_id": "aaaaaaaa", "params": {"micro_batch": 4}},
        "tuned": {"config_id": "bbbbbbbb", "params": {"micro_batch": 2}}}}))
    text = markdown(records, tmp_path)
    assert "| ray | 6.50 [" in text and "| torchrun | 1.10 [" in text
    assert "| ddp | micro_batch=4 | 105 [" in text and "| 1.190 [" in text


@pytest.mark.slow
def test_a_slow_trial_is_pruned_and_its_run_cancelled(tmp_path, monkeypatch):
    """A real tune on CPU (ddp, one rank) of micro-batch 16 against micro-batch 1 at a global
    batch of 16: micro-batch 1 runs 16 micro-steps per step, slower per token on this tiny model.
    The seeded grid runs micro-batch 16 first (MedianPruner(n_startup_trials=1) needs one
    finished trial); micro-batch 1 reports below it at the first step past the warm-up, so the
    pruner stops it and tune cancels its run there (seed 1: the seed picks the grid order).
    Without pruning it would finish all its steps (status ok) and be a COMPLETE trial.

    Mocked: the size of the gap. Measured, it is about 2x (64 against 1: 3,139 against 1,600
    tok/s), inside this machine's 0.6-2.7x load noise, and once under load the slow trial
    finished as COMPLETE. So the micro-batch-1 run's progress reaches the tuner at a tenth of its
    tok/s: the pruner's decision is the tuner's, not the load's. The runs, the cancel and the
    records are real."""
    from dataclasses import replace

    from shardbench.suite.execute import runner as runner_module
    from shardbench.suite.execute.events import RunProgress

    real_runner = runner_module.Runner

    def runner_with_a_clear_gap(specs, backend, results, emit=lambda event: None, **kw):
        def slowed(event):
            if isinstance(event, RunProgress) and event.tokens_per_s and specs[0].micro_batch == 1:
                event = replace(event, tokens_per_s=event.tokens_per_s / 10)
            emit(event)
        return real_runner(specs, backend, results, slowed, **kw)

    monkeypatch.setattr(runner_module, "Runner", runner_with_a_clear_gap)
    out = tmp_path / "tune"
    base = ["--world-sizes", "1", "--seq-lens", "32", "--steps", "12", "--warmup-steps", "2", "--micro-batch", "16",
            "--global-batch", "16", "--precision", "fp32", "--device", "cpu", "--shape", "cpu", "--repeats", "1"]
    code = main(["tune", *base, "--strategies", "ddp", "--trials", "2", "--out", str(out), "--tune-seed", "1",
                 "--space", "micro_batch=[16,1]", "--space", "activation_checkpointing=[false]",
                 "--space", "reshard_after_forward=[true]", "--space", "bucket_mib=[25.0]"])
    assert code == 0
    (study,) = json.loads((out / "tune.json").read_text())
    first, second = study["trials"]
    assert (first["params"]["micro_batch"], first["state"]) == (16, "COMPLETE")  # the seeded grid's order
    assert (second["params"]["micro_batch"], second["state"]) == (1, "PRUNED")
    assert (first["grad_accum"], second["grad_accum"]) == (1, 16)  # every trial records the axis both ways
    pruned = json.loads((out / "trials" / second["run_id"] / "result.json").read_text())
    assert pruned["status"] == "cancelled"  # stopped mid-run, not measured to the end
    log = (out / "trials" / second["run_id"] / "log.txt").read_text()
    assert '"step": 12' not in log.replace(" ", "").replace('"step":12', '"step": 12')
    assert study["best"]["micro_batch"] == 16
