"""Issue 31, finding 1: every fsdp/zero3 verdict shows what each gathered per step (the trainer's
own collective counter), so a "fsdp faster than zero3" can be read against the traffic behind it."""
from __future__ import annotations

from shardbench.suite.analyze import analysis
from shardbench.suite.report import markdown as report
from tests.synthetic import record


def gathering(strategy: str, tps: float, calls: int, nbytes: int, repeat: int) -> dict:
    return record(strategy, 2, tps, repeat=repeat,
                  comm_per_step={"all_gather": {"calls": calls, "bytes": nbytes, "seconds": 0.01}})


def test_fsdp_and_zero3_verdicts_show_each_ones_all_gather_bytes_and_calls():
    recs = [gathering("fsdp", 1000.0 + k, 4, 10_899_968, k) for k in range(3)]
    recs += [gathering("zero3", 900.0 + k, 7, 10_899_968, k) for k in range(3)]
    recs += [record("ddp", 2, 1100.0 + k, repeat=k) for k in range(3)]
    an = analysis.analyze(recs)
    text = report.verdicts_section(an)
    assert "all-gather per step (fsdp, zero3)" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "dev" in line]
    assert rows and all("fsdp @ 2 dev: 4 calls, 10.4 MiB" in r and "zero3 @ 2 dev: 7 calls, 10.4 MiB" in r
                        for r in rows)
    assert set(an.runs.loc[an.runs["strategy"] == "ddp", "all_gather_per_step"].dropna()) == set()


def test_no_column_without_a_gathering_strategy():
    recs = [record(s, 2, 1000.0 + 10 * k + (50 if s == "zero1" else 0), repeat=k)
            for s in ("ddp", "zero1") for k in range(3)]
    assert "all-gather per step" not in report.verdicts_section(analysis.analyze(recs))
