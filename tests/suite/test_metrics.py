"""Scaling efficiency, cost and repeat statistics, checked against numbers worked out by hand."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from tui.suite import metrics
from tui.suite.synthetic import record


def row(df, run_id):
    return df[df["run_id"] == run_id].iloc[0]


def test_scaling_efficiency_against_each_strategys_smallest_world_size():
    recs = [
        record("ddp", 1, 1000.0, repeat=0), record("ddp", 1, 1200.0, repeat=1),  # base mean 1100
        record("ddp", 2, 1980.0), record("ddp", 4, 3300.0),
        # zero3 never ran at 1 device: its base is 2, not ddp's 1 (the seed's bug compared all to 1)
        record("zero3", 2, 1500.0), record("zero3", 4, 2400.0),
        record("zero3", 8, 1.0, status="failed"),
        # another seq len is another curve with its own base
        record("ddp", 2, 500.0, seq_len=128), record("ddp", 4, 900.0, seq_len=128),
    ]
    df = metrics.to_frame(recs)
    # by hand: eff(N) = tps(N) / (tps(base) * N / base)
    assert row(df, "ddp-w2-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(1980 / (1100 * 2))  # 0.9
    assert row(df, "ddp-w4-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(3300 / (1100 * 4))  # 0.75
    assert row(df, "ddp-w1-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(1000 / 1100)
    assert row(df, "zero3-w2-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(1.0)
    assert row(df, "zero3-w4-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(2400 / (1500 * 4 / 2))  # 0.8
    assert row(df, "zero3-w4-s64-mb4-ga1-r0")["scaling_base_world_size"] == 2
    assert row(df, "ddp-w4-s128-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(900 / (500 * 2))  # 0.9
    assert math.isnan(row(df, "zero3-w8-s64-mb4-ga1-r0")["scaling_efficiency"])


def test_cost_per_million_tokens_from_record_or_values_file(tmp_path, monkeypatch):
    (tmp_path / "gpu9.yaml").write_text("shape:\n  name: gpu9\n  usdPerGpuHour: 3.6\n")
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(tmp_path))
    recs = [
        record("ddp", 2, 1800.0, usd_per_gpu_hour=2.0),  # price in the record
        record("fsdp", 4, 4000.0, shape="gpu9"),  # price from values/gpu9.yaml
        record("zero2", 2, 1000.0, shape="nowhere"),  # no price anywhere: no cost, no crash
    ]
    df = metrics.to_frame(recs)
    # 2 $/h x 2 devices = 4 $/h = 1/900 $/s; 1800 tok/s -> 1e6 tokens take 555.6 s -> $0.6173
    assert row(df, "ddp-w2-s64-mb4-ga1-r0")["cost_usd_per_mtok"] == pytest.approx(2.0 * 2 / 3600 / 1800 * 1e6)
    assert row(df, "ddp-w2-s64-mb4-ga1-r0")["cost_usd_per_mtok"] == pytest.approx(0.61728, rel=1e-4)
    # 3.6 $/h x 4 = 14.4 $/h = 0.004 $/s; 4000 tok/s -> 250 s per 1e6 tokens -> $1.00
    assert row(df, "fsdp-w4-s64-mb4-ga1-r0")["cost_usd_per_mtok"] == pytest.approx(1.0)
    assert row(df, "fsdp-w4-s64-mb4-ga1-r0")["usd_per_gpu_hour"] == 3.6
    assert pd.isna(row(df, "zero2-w2-s64-mb4-ga1-r0")["cost_usd_per_mtok"])


def test_summary_mean_and_spread_over_repeats():
    recs = [record("ddp", 2, v, repeat=i) for i, v in enumerate([900.0, 1000.0, 1100.0])]
    recs.append(record("zero2", 2, 700.0))
    s = metrics.summarize(metrics.to_frame(recs))
    ddp = s[s["strategy"] == "ddp"].iloc[0]
    assert ddp["repeats"] == 3
    assert ddp["tokens_per_s_mean"] == pytest.approx(1000.0)
    assert ddp["tokens_per_s_std"] == pytest.approx(100.0)  # sample std of 900, 1000, 1100
    zero2 = s[s["strategy"] == "zero2"].iloc[0]
    assert zero2["repeats"] == 1 and zero2["tokens_per_s_std"] == 0.0


def test_csv_has_one_row_per_record_and_every_documented_column(tmp_path):
    recs = [record("ddp", 1, 100.0), record("zero3", 2, 150.0, status="oom")]
    df = metrics.to_frame(recs)
    path = metrics.write_csv(df, tmp_path / "metrics.csv")
    back = pd.read_csv(path)
    assert len(back) == 2
    assert list(back.columns) == list(metrics.COLUMN_DOCS)
    assert set(back["status"]) == {"ok", "oom"}
    assert back.loc[back["run_id"] == "ddp-w1-s64-mb4-ga1-r0", "tokens_per_s"].item() == 100.0


def test_load_records_skips_unreadable_files(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "result.json").write_text('{"run_id": "a"}')
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "result.json").write_text("{half")
    assert metrics.load_records(tmp_path) == [{"run_id": "a"}]


def test_unknown_shape_still_scales():
    # --shape none: gpu_shape is None in every record (it used to crash the grouping).
    recs = [record("ddp", 1, 1000.0, shape=None), record("ddp", 2, 1500.0, shape=None)]
    assert all(r["gpu_shape"] is None for r in recs)
    df = metrics.to_frame(recs)
    assert row(df, "ddp-w2-s64-mb4-ga1-r0")["scaling_efficiency"] == pytest.approx(0.75)


def test_no_ok_run_gives_empty_efficiency_and_a_report(tmp_path):
    import json

    from tui.suite.report import build_report

    recs = [record("ddp", 1, 1.0, status="failed"), record("zero3", 2, 1.0, status="failed")]
    df = metrics.to_frame(recs)
    assert df["scaling_efficiency"].isna().all()
    for r in recs:
        d = tmp_path / "results" / r["run_id"]
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps(r))
    build_report(tmp_path / "results", tmp_path / "out")
    assert "Failed runs" in (tmp_path / "out" / "BENCHMARK_REPORT.md").read_text()
