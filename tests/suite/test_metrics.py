"""Rows, intervals, scaling, speedup and cost, checked against numbers worked out by hand."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from shardbench.suite.analyze import analysis
from shardbench.suite.analyze import losscheck
from shardbench.suite.analyze import rows as metrics
from shardbench.suite.analyze import stats
from tests.synthetic import record


def rid(strategy, world, seq_len=64, repeat=0):
    """The run id the synthetic helper gives this run (the contract's id, with its config hash)."""
    return record(strategy, world, seq_len=seq_len, repeat=repeat)["run_id"]


def row(df, run_id):
    return df[df["run_id"] == run_id].iloc[0]


def config(an, strategy, world, seq_len=64):
    return next(c for c in an.configs if c.strategy == strategy and c.world_size == world and c.seq_len == seq_len)


def test_student_t_interval_by_hand():
    e = stats.estimate([900.0, 1000.0, 1100.0])
    assert (e.n, e.mean, e.sd) == (3, 1000.0, pytest.approx(100.0))
    # on a log scale: 1000 x exp(+-t(0.975, 2) x (100/1000)/sqrt(3)), t = 4.303
    f = math.exp(4.30265 * 0.1 / math.sqrt(3))
    assert (e.lo, e.hi) == (pytest.approx(1000 / f), pytest.approx(1000 * f))
    assert (round(e.lo, 2), round(e.hi, 2)) == (780.04, 1281.99)
    one = stats.estimate([5.0, float("nan")])
    assert one.n == 1 and one.sd is None and not one.has_interval
    assert stats.t975(40) == pytest.approx(2.021, abs=1e-3) and stats.t975(2) == pytest.approx(4.303, abs=1e-3)


def test_ratio_interval_propagates_both_spreads():
    num, den = stats.estimate([1800.0, 2000.0, 2200.0]), stats.estimate([990.0, 1000.0, 1010.0])
    r = stats.ratio(num, den, scale=0.5)
    # r = 0.5 x 2000 / 1000 = 1.0; relative variances (200/2000)^2/3 + (10/1000)^2/3 add
    ua, ub = 0.1 ** 2 / 3, 0.01 ** 2 / 3
    df = (ua + ub) ** 2 / (ua ** 2 / 2 + ub ** 2 / 2)  # Welch-Satterthwaite: 2.04 -> t(2) = 4.303
    assert r.mean == pytest.approx(1.0)
    f = math.exp(stats.t975(df) * math.sqrt(ua + ub))  # log scale: [r / f, r x f]
    assert (r.lo, r.hi) == (pytest.approx(1 / f), pytest.approx(f))
    # a wider base widens the ratio's standard error: both spreads count
    wide_base = stats.ratio(num, stats.estimate([900.0, 1000.0, 1100.0]), scale=0.5)
    assert wide_base.sd == pytest.approx(math.sqrt(2 * 0.1 ** 2 / 3) * math.sqrt(3))
    assert stats.ratio(num, stats.estimate([1000.0]), scale=0.5).half is None  # one base run: no interval


def test_scaling_efficiency_against_each_strategys_smallest_world_size():
    recs = [
        record("ddp", 1, 1000.0, repeat=0), record("ddp", 1, 1200.0, repeat=1),  # base mean 1100
        record("ddp", 2, 1980.0), record("ddp", 4, 3300.0),
        record("zero3", 2, 1500.0), record("zero3", 4, 2400.0),  # zero3's own smallest is 2
        record("zero3", 8, 1.0, status="failed"),
        record("ddp", 2, 500.0, seq_len=128), record("ddp", 4, 900.0, seq_len=128),  # another curve
    ]
    an = analysis.analyze(recs)
    df = an.runs
    assert row(df, rid("ddp", 2))["scaling_efficiency"] == pytest.approx(1980 / (1100 * 2))
    assert row(df, rid("ddp", 4))["scaling_efficiency"] == pytest.approx(3300 / (1100 * 4))
    assert row(df, rid("zero3", 4))["scaling_efficiency"] == pytest.approx(2400 / (1500 * 4 / 2))
    assert row(df, rid("zero3", 4))["scaling_base_world_size"] == 2
    assert row(df, rid("ddp", 4, seq_len=128))["scaling_efficiency"] == pytest.approx(900 / (500 * 2))
    assert pd.isna(row(df, rid("zero3", 8))["scaling_efficiency"])
    assert config(an, "ddp", 4).efficiency.mean == pytest.approx(0.75)
    assert config(an, "ddp", 4).efficiency.half is None  # one 4-device run: no interval


def test_failed_base_leaves_efficiency_empty_with_the_reason():
    recs = [record("zero3", 1, 1.0, status="oom"), record("zero3", 2, 1500.0), record("zero3", 4, 2400.0)]
    an = analysis.analyze(recs)
    # The old code took the 2-device run as base: 1.00 at 2 and 0.80 at 4 devices.
    assert an.runs["scaling_efficiency"].isna().all()
    assert config(an, "zero3", 4).efficiency is None
    assert config(an, "zero3", 4).efficiency_note.startswith(f"base zero3 at 1 dev has no ok run: {rid('zero3', 1)} oom")


def test_speedup_over_the_best_single_device_run_of_any_strategy():
    recs = [record("ddp", 1, 1000.0), record("ddp", 1, 1020.0, repeat=1),
            record("zero3", 1, 800.0), record("zero3", 1, 820.0, repeat=1),
            record("zero3", 2, 1515.0), record("zero3", 2, 1525.0, repeat=1)]
    an = analysis.analyze(recs)
    z2 = config(an, "zero3", 2)
    assert z2.speedup.mean == pytest.approx(1520 / 1010) and z2.speedup_note == "vs ddp @ 1 dev"
    assert z2.efficiency.mean == pytest.approx(1520 / (810 * 2))  # its own base, not ddp's
    assert row(an.runs, rid("zero3", 2))["speedup_vs_best_1dev"] == pytest.approx(1515 / 1010)


def test_cost_per_million_tokens_from_record_or_values_file(tmp_path, monkeypatch):
    (tmp_path / "gpu9.yaml").write_text("shape:\n  name: gpu9\n  usdPerGpuHour: 3.6\n")
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(tmp_path))
    recs = [record("ddp", 2, 1800.0, usd_per_gpu_hour=2.0), record("fsdp", 4, 4000.0, shape="gpu9"),
            record("zero2", 2, 1000.0, shape="nowhere")]
    df = metrics.to_frame(recs)
    # 2 $/h x 2 devices = 1/900 $/s; 1800 tok/s -> 1e6 tokens take 555.6 s -> $0.6173
    assert row(df, rid("ddp", 2))["cost_usd_per_mtok"] == pytest.approx(0.61728, rel=1e-4)
    # 3.6 $/h x 4 = 0.004 $/s; 4000 tok/s -> 250 s per 1e6 tokens -> $1.00
    assert row(df, rid("fsdp", 4))["cost_usd_per_mtok"] == pytest.approx(1.0)
    assert pd.isna(row(df, rid("zero2", 2))["cost_usd_per_mtok"])


def test_schema_2_fields_are_read_and_missing_ones_are_unknown():
    v2 = record("zero3", 2, 1000.0, schema_version=2, repeat=1, config_id="zero3-w2-abc123",
                run_id="zero3-w2-s64-r1-abc123",
                memory=[{"rank": 0, "setup_peak_bytes": 1, "train_peak_bytes": 3 * 2 ** 30, "rss_peak_bytes": 5 * 2 ** 30,
                         "num_alloc_retries": 0},
                        {"rank": 1, "setup_peak_bytes": 1, "train_peak_bytes": 2 ** 30, "rss_peak_bytes": 2 ** 30,
                         "num_alloc_retries": 2}],
                model_state=[{"rank": 0, "params_bytes": 2 ** 20, "grads_bytes": 2 ** 20, "optimizer_bytes": 2 ** 21,
                              "master_bytes": 2 ** 20, "comm_buffer_bytes": 0, "total_bytes": 5 * 2 ** 20},
                             {"rank": 1, "params_bytes": 1, "grads_bytes": 1, "optimizer_bytes": 1,
                              "master_bytes": 1, "comm_buffer_bytes": 0, "total_bytes": 4}],
                comm_per_step={"all_gather": {"calls": 4.0, "bytes": 4e6}, "reduce_scatter": {"calls": 2.0, "bytes": 2e6}},
                threads_per_rank=1, cpu_affinity=[[0], [1]], cpu_count=2,
                load_avg_1m_start=0.5, load_avg_1m_end=1.5, grad_reduce_dtype="fp32")
    r = metrics.flatten(v2)
    assert (r["repeat"], r["config_id"]) == (1, "zero3-w2-abc123")
    assert r["train_peak_gib"] == 3.0 and r["rss_footprint_gib"] == 5.0 and r["gpu_alloc_retries"] == 2
    assert r["model_state_optimizer_gib"] == pytest.approx(2 / 1024) and r["model_state_master_gib"] == pytest.approx(1 / 1024)
    assert r["comm_bytes_per_step"] == 6e6 and r["comm_calls_per_step"] == 6.0
    assert r["comm_per_step"].startswith("all_gather 4 x 977 KiB")
    assert (r["cpu_affinity"], r["host_cpus"], r["load_avg_1m_end"]) == ("0 1", 2, 1.5)
    v1 = metrics.flatten(record("ddp", 1, 1000.0))  # schema 1: the new fields are unknown, not 0
    assert v1["comm_bytes_per_step"] is None and v1["load_avg_1m_start"] is None and v1["train_peak_gib"] is None
    # a record written before the run contract: repeat and config from the old id
    old = {k: v for k, v in record("ddp", 1, 1000.0).items() if k not in ("config_id", "repeat")}
    old = metrics.flatten({**old, "run_id": "ddp-w1-s64-mb4-ga1-r2"})
    assert old["repeat"] == 2 and old["config_id"] == "ddp-w1-s64-mb4-ga1"
    assert analysis.analyze([record("ddp", 1, 1000.0)]).runs["host_overloaded"].isna().all()


def test_load_records_turns_every_bad_file_into_a_row(tmp_path):
    good = record("ddp", 1, 100.0)
    files = {"good": json.dumps(good), "half": "{half", "deep": "[" * 100000 + "]" * 100000, "num": "3",
             "v3": json.dumps({**good, "schema_version": 3}), "nan": json.dumps({**good, "tokens_per_s": float("nan")}),
             "status": json.dumps({**good, "status": "great"})}
    for name, text in files.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "result.json").write_text(text)
    rows = {r["_source"].split("/")[-2]: r for r in metrics.load_records(tmp_path)}
    assert set(rows) == set(files)  # the old loader kept only "good" (and "v3", shown as ok)
    assert rows["good"]["status"] == "ok"
    for name in ("half", "deep", "num", "v3", "nan", "status"):
        assert rows[name]["status"] == metrics.UNREADABLE and rows[name]["error"], name


def test_find_result_sets_below_a_dir(tmp_path):
    for path in ("results/default/ddp-w1/result.json", "results/h100/a/zero3-w8/result.json",
                 "results/default/report/x/result.json"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("{}")
    assert metrics.find_result_sets(tmp_path / "results") == [tmp_path / "results/default", tmp_path / "results/h100/a"]
    assert metrics.find_result_sets(tmp_path / "results/default") == [tmp_path / "results/default"]


def test_csv_has_one_row_per_record_and_every_documented_column(tmp_path):
    from shardbench.suite.report.markdown import report_from_records

    report_from_records([record("ddp", 1, 100.0), record("zero3", 2, 150.0, status="oom")], tmp_path, tmp_path)
    back = pd.read_csv(tmp_path / "metrics.csv")
    assert len(back) == 2 and set(back["status"]) == {"ok", "oom"}
    documented = [line.split("`")[1] for line in (tmp_path / "BENCHMARK_REPORT.md").read_text()
                  .split("## Columns of metrics.csv")[1].splitlines() if line.startswith("| `")]
    assert list(back.columns) == documented
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert {"tokens_per_s_n", "tokens_per_s_mean", "tokens_per_s_sd", "tokens_per_s_ci_low",
            "tokens_per_s_ci_high", "scaling_efficiency_ci_high", "speedup_mean"} <= set(summary.columns)


def test_loss_tolerance_follows_precision_and_gradient_reduction():
    assert losscheck.loss_tolerance("fp32") == 1e-4 and losscheck.loss_tolerance("fp32", "fp32") == 1e-4
    assert losscheck.loss_tolerance("bf16", "fp32") == 3e-4 and losscheck.loss_tolerance("fp32", "bf16") == 3e-4
    # a bf16-reduced fp32 run is its own trajectory group, not a broken member of the fp32 one
    fp32 = [record("ddp", 2, 1000.0, repeat=i, loss_per_step=[9.0, 8.5], grad_reduce_dtype="fp32") for i in range(2)]
    bf16 = [record("zero2", 2, 1000.0, loss_per_step=[9.0, 8.51], grad_reduce_dtype="bf16")]
    an = analysis.analyze(fp32 + bf16)
    assert not an.runs["loss_check"].eq("broken").any() and len(an.loss_groups) == 1


@pytest.mark.timeout(60)
def test_a_fifo_or_a_symlink_to_dev_zero_is_a_row_with_the_reason_not_a_hang(tmp_path):
    """Only regular files are read as records: a FIFO named result.json blocked `report` forever,
    a symlink to /dev/zero ate memory until MemoryError."""
    import os

    from shardbench.suite.analyze.rows import load_records
    from tests.synthetic import record

    (tmp_path / "good").mkdir()
    (tmp_path / "good" / "result.json").write_text(json.dumps(record("ddp", 1, 100.0)))
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "result.json")
    (tmp_path / "zero").mkdir()
    os.symlink("/dev/zero", tmp_path / "zero" / "result.json")
    rows = {Path(r["_source"]).parent.name: r for r in load_records(tmp_path)}
    assert rows["good"]["status"] == "ok"
    assert rows["fifo"]["status"] == "unreadable" and "not a regular file (a FIFO)" in rows["fifo"]["error"]
    assert rows["zero"]["status"] == "unreadable" and "a character device via a symlink" in rows["zero"]["error"]
    from shardbench.suite.execute.store import read_json

    with pytest.raises(ValueError, match="not a regular file"):  # resume reads it too
        read_json(tmp_path / "fifo" / "result.json")
