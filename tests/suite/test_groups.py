"""Issue 18: comparisons of like with like. Verdict groups, efficiency bases and loss groups are
"all measured settings equal except strategy / world size" (suite/analyze/groups.py), every verdict
names the configurations it compares, and the report answers first."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.trainer import contract
from shardbench.suite.analyze import analysis
from shardbench.suite.analyze import groups
from shardbench.suite.report.markdown import build_report
from tests.synthetic import record

REF_LOSS = [9.0, 8.5, 8.2, 8.1, 8.05, 8.03]


def runs(strategy: str, world: int, values: list[float], tag: str = "", **settings) -> list[dict]:
    """Repeats of one configuration; `settings` are record fields that change the measurement,
    so they get a config id (and run id) of their own, as the trainer would give them."""
    ga = settings.pop("grad_accum", 1)
    config = contract.config_id({"strategy": strategy, "world": world, "ga": ga, **settings})
    out = []
    for i, v in enumerate(values):
        r = record(strategy, world, v, grad_accum=ga, repeat=i, loss_per_step=REF_LOSS, **settings)
        r["config_id"] = config
        r["run_id"] = contract.run_id(strategy, world, 64, 4, ga, config, i)
        out.append(r)
    return out


def test_verdicts_compare_only_configurations_that_differ_in_strategy():
    """The old groups pooled grad-reduction dtypes and took each strategy's best mean: 'ddp (bf16
    reduction) 9.1% higher than fsdp (fp32)'. Now each dtype is a group of its own, labelled."""
    recs = (runs("ddp", 2, [1090.0, 1091.0, 1089.0], grad_reduce_dtype="bf16")
            + runs("ddp", 2, [1000.0, 1001.0, 999.0], grad_reduce_dtype="fp32")
            + runs("fsdp", 2, [1050.0, 1051.0, 1049.0], grad_reduce_dtype="bf16")
            + runs("fsdp", 2, [1010.0, 1011.0, 1009.0], grad_reduce_dtype="fp32"))
    an = analysis.analyze(recs)
    throughput = [v for v in an.verdicts if v.category.name == "throughput"]
    assert len(throughput) == 2
    for v in throughput:
        dtypes = {c.settings["grad_reduce_dtype"] for c in v.candidates}
        assert len(dtypes) == 1 and f"grad-reduce-dtype {dtypes.pop()}" in v.group
        for c in v.candidates:  # every configuration compared is named
            assert f"`{c.name}`" in v.text
    fp32 = next(v for v in throughput if "grad-reduce-dtype fp32" in v.group)
    assert fp32.best.strategy == "fsdp"


def test_efficiency_base_differs_only_in_world_size():
    """A 1-device run with activation checkpointing (slower) is not the base of runs without it:
    the old base pooled both (1900 / (850 x 2) = 1.12 instead of 0.95)."""
    recs = (runs("ddp", 1, [1000.0, 1001.0, 999.0]) + runs("ddp", 1, [700.0, 701.0, 699.0], activation_checkpointing=True)
            + runs("ddp", 2, [1900.0, 1901.0, 1899.0]) + runs("ddp", 2, [1330.0, 1331.0, 1329.0], activation_checkpointing=True))
    an = analysis.analyze(recs)
    two = {c.settings["activation_checkpointing"]: c for c in an.configs if c.world_size == 2}
    assert two[False].efficiency.mean == pytest.approx(0.95, abs=1e-3)
    assert two[True].efficiency.mean == pytest.approx(0.95, abs=1e-3)


def test_efficiency_base_has_the_same_grad_accum_or_global_batch():
    recs = (runs("ddp", 1, [1000.0, 1001.0]) + runs("ddp", 1, [1200.0, 1201.0], grad_accum=4)
            + runs("ddp", 2, [1900.0, 1901.0]))
    an = analysis.analyze(recs)
    c = next(c for c in an.configs if c.world_size == 2)
    assert c.efficiency.mean == pytest.approx(0.95, abs=1e-3)  # against ga 1, not the pool (1100)
    # fixed global batch: ga 2 at 1 device is the base of ga 1 at 2 devices
    fixed = runs("zero2", 1, [1000.0, 1001.0], grad_accum=2) + runs("zero2", 2, [1800.0, 1801.0])
    c = next(c for c in analysis.analyze(fixed).configs if c.world_size == 2)
    assert c.efficiency.mean == pytest.approx(0.90, abs=1e-3)


def test_settings_come_from_the_records_command_line():
    """A knob the record has no column for still separates groups: settings() parses `args`
    through the trainer's own RunConfig (so a new RunConfig field joins every grouping)."""
    base = ["--strategy", "ddp", "--steps", "6"]
    a = record("ddp", 2, 1000.0, args=base + ["--weight-decay", "0.1"], optimizer={})
    b = record("ddp", 2, 1000.0, args=base, optimizer={})
    sa, sb = groups.settings(a), groups.settings(b)
    assert sa["weight_decay"] == 0.1 and sb["weight_decay"] == 0.01
    assert groups.key(sa, groups.VERDICT_EXCEPT) != groups.key(sb, groups.VERDICT_EXCEPT)
    c = record("fsdp", 2, 1000.0, args=["--strategy", "fsdp", "--steps", "6"], optimizer={})
    # strategy and launcher differ only:
    assert groups.key(groups.settings(c), groups.VERDICT_EXCEPT) == groups.key(sb, groups.VERDICT_EXCEPT)


def test_report_opens_with_the_summary_table(tmp_path: Path):
    recs = (runs("ddp", 2, [1000.0, 1010.0, 990.0], model_state_bytes_per_rank=40 * 2 ** 20)
            + runs("zero3", 2, [800.0, 805.0, 795.0], model_state_bytes_per_rank=25 * 2 ** 20))
    results = tmp_path / "results"
    for r in recs:
        (results / r["run_id"]).mkdir(parents=True)
        (results / r["run_id"] / "result.json").write_text(json.dumps(r))
    md = build_report(results, tmp_path / "out").markdown.read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[0] == "## Summary"
    assert headings.index("## How this report decides") > headings.index("## Verdicts")
    summary = md.split("## Summary\n", 1)[1].split("\n## ", 1)[0]
    row = [line for line in summary.splitlines() if line.startswith("| 2 dev")][0]
    assert "**ddp**; zero3 -20%" in row and "ddp 1,000 [975, 1,025] tok/s" in row
    assert "**zero3**" in row and "zero3 0.02441 GiB" in row


def test_strategy_specific_settings_do_not_split_other_strategies():
    """bucket_mib does not apply to fsdp, reshard_after_forward not to ddp (the record says None):
    one group at the defaults; a bucket sweep makes two groups, fsdp in both."""
    def cfg(strategy, tps, bucket, reshard):
        return runs(strategy, 2, [tps, tps + 1, tps - 1], bucket_mib=bucket, reshard_after_forward=reshard)

    default = cfg("ddp", 1000.0, 25.0, None) + cfg("fsdp", 900.0, None, True) + cfg("zero3", 800.0, 25.0, True)
    (v,) = [v for v in analysis.analyze(default).verdicts if v.category.name == "throughput"]
    assert sorted(c.strategy for c in v.candidates) == ["ddp", "fsdp", "zero3"]
    sweep = default + cfg("ddp", 1100.0, 10.0, None) + cfg("zero3", 850.0, 10.0, True)
    found = [v for v in analysis.analyze(sweep).verdicts if v.category.name == "throughput"]
    assert sorted((v.group.split("bucket-mib ")[1], sorted(c.strategy for c in v.candidates)) for v in found) == [
        ("10", ["ddp", "fsdp", "zero3"]), ("25", ["ddp", "fsdp", "zero3"])]


def test_groupings_follow_the_knobs_roles_and_the_records_settings():
    """One derivation (merge of issues 17 and 18): what may differ in a loss group or an
    efficiency base is the knob's `same_loss` / `per_world` role in trainer/config.py, and a
    record's settings start from its `settings` (the knobs as given), the trainer's resolved
    top-level values winning (precision auto -> fp32; None where a knob does not apply)."""
    from shardbench.trainer import knobs
    from shardbench.trainer.config import RunConfig

    assert {"bucket_mib", "reshard_after_forward", "micro_batch", "strategy"} <= groups.LOSS_EXCEPT
    assert not {"weight_decay", "lr", "grad_reduce_dtype", "seed"} & groups.LOSS_EXCEPT
    assert groups.BASE_EXCEPT == {"world_size", "nodes"} | knobs.per_world()

    def rec(strategy: str, **knob_values) -> dict:
        r = record(strategy, 2)
        r["args"] = ["--this-flag-does-not-parse"]  # settings, not args, are read
        r["settings"] = knobs.settings(RunConfig(strategy=strategy, **knob_values))
        r["bucket_mib"] = None if strategy == "fsdp" else r["settings"]["bucket_mib"]
        return r

    ddp10, ddp25, fsdp = (groups.settings(rec("ddp", bucket_mib=10.0)), groups.settings(rec("ddp")),
                          groups.settings(rec("fsdp")))
    assert ddp10["precision"] == "fp32" and ddp10["bucket_mib"] == 10.0 and fsdp["bucket_mib"] is None
    assert groups.loss_key(ddp10) == groups.loss_key(ddp25) == groups.loss_key(fsdp)
    assert groups.key(ddp10, groups.VERDICT_EXCEPT) != groups.key(ddp25, groups.VERDICT_EXCEPT)
    wd = groups.settings(rec("ddp", weight_decay=0.1))
    assert groups.loss_key(wd) != groups.loss_key(ddp25) and groups.base_key(wd) != groups.base_key(ddp25)
