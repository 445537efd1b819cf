"""The suite's view of a run's settings is derived from trainer.config.RunConfig (trainer/knobs.py):
the matrix and run specs re-declare no knob, metrics.csv has a column per measured knob, and the
loss check's groups and the scaling bases split on every knob that changes what they compare."""
from __future__ import annotations

from dataclasses import fields

from shardbench.trainer import knobs
from shardbench.trainer.config import RunConfig
from shardbench.suite.analyze import analysis
from shardbench.suite.analyze import groups
from shardbench.suite.analyze import rows as metrics
from shardbench.suite.execute.collect import failed_record
from shardbench.suite.matrix.expand import KNOB_KEYS, MatrixSpec, RunSpec, expand
from tests.synthetic import record


def test_matrix_and_run_spec_declare_no_trainer_knob():
    """MatrixSpec once re-declared 10 of RunConfig's fields and RunSpec 16, with defaults of their
    own; now a knob's default is RunConfig's alone."""
    assert {f.name for f in fields(MatrixSpec)} & KNOB_KEYS == set()
    assert {f.name for f in fields(RunSpec)} & {f.name for f in fields(RunConfig)} <= {"run_id", "repeat", "launcher"}
    m = MatrixSpec()
    for name in ("steps", "micro_batch", "warmup_steps", "seed", "model", "precision", "device"):
        assert getattr(m, name) == knobs.default(name)
    assert MatrixSpec(steps=7).overrides == {"steps": 7} and MatrixSpec(steps=7).steps == 7


def test_a_run_spec_holds_the_run_config():
    (spec,), errors = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[2], global_batch=16, micro_batch=2,
                                        weight_decay=0.1))
    assert errors == []
    assert isinstance(spec.config, RunConfig) and spec.config.weight_decay == 0.1
    assert (spec.micro_batch, spec.grad_accum, spec.global_batch) == (2, 4, 16)
    assert spec.run_config("/out").output_dir == "/out" and spec.run_config().run_id == spec.run_id


def test_weight_decay_grad_clip_and_lr_warmup_split_loss_groups():
    """Sweeping weight_decay once marked every run broken: it was not in the loss group's columns,
    so runs with different curves were compared with each other."""
    assert not {"weight_decay", "grad_clip", "lr_warmup_steps"} & groups.LOSS_EXCEPT
    for knob, values in (("weight_decay", (0.0, 0.1)), ("grad_clip", (0.5, 1.0)), ("lr_warmup_steps", (0, 5))):
        recs = [record("ddp", 1, 1000.0, repeat=i, loss_per_step=curve,
                       optimizer={"name": "AdamW", "lr": 1e-4, knob: value})
                for i, (value, curve) in enumerate(zip(values, ([9.0, 8.5], [9.0, 8.0])))]
        an = analysis.analyze(recs)
        assert not an.runs["loss_check"].eq("broken").any(), knob
        assert len(an.runs[knob].unique()) == 2


def test_every_measured_knob_is_a_csv_column():
    columns = {name for name, _, _ in metrics.COLUMNS}
    for f in knobs.measured():
        assert knobs.column(f) in columns, f.name
    row = metrics.to_frame([record("ddp", 1, settings={"activation_checkpointing": True, "weight_decay": 0.2})])
    assert bool(row.loc[0, "activation_checkpointing"]) is True and row.loc[0, "weight_decay"] == 0.2


def test_a_scaling_base_shares_every_knob():
    """Activation checkpointing on and off at world sizes 1 and 2: each world-size-2 run is
    scaled against the base with its own setting (the base once mixed both)."""
    recs = []
    for ac, speed in ((False, 1000.0), (True, 700.0)):
        for world in (1, 2):
            recs.append(record("ddp", world, speed * world, settings={"activation_checkpointing": ac},
                               config_id=f"ac{ac}w{world}"))
    an = analysis.analyze(recs)
    assert sorted(an.runs["scaling_efficiency"].round(6)) == [1.0, 1.0, 1.0, 1.0]


def test_a_failed_record_carries_the_settings_of_its_spec():
    (spec,), _ = expand(MatrixSpec(strategies=["ddp"], world_sizes=[1], grad_clip=0.5))
    rec = failed_record(spec, "boom")
    assert rec["settings"]["grad_clip"] == 0.5 and rec["settings"]["strategy"] == "ddp"


def test_the_suite_cli_has_a_flag_per_matrix_key_and_knob():
    """One generator (trainer.flags) writes the trainer's, the matrix's and the cluster's flags."""
    from shardbench.suite.cli.commands import build_parser

    run = next(a for a in build_parser()._actions if a.dest == "command").choices["run"]
    flags = {s for a in run._actions for s in a.option_strings}
    assert {"--" + k.replace("_", "-") for k in KNOB_KEYS} <= flags
    assert {"--world-sizes", "--strategies", "--kubeconfig", "--keep-failed", "--start-timeout-s"} <= flags
    args = run.parse_args(["--world-sizes", "1,2", "--weight-decay", "[0.0, 0.1]", "--lr", "3e-4"])
    assert args.world_sizes == [1, 2] and getattr(args, "knob.weight_decay") == [0.0, 0.1]
    assert getattr(args, "knob.lr") == 3e-4  # YAML 1.1 would read 3e-4 as text
