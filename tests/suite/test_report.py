"""The report from known records: winners and margins, repeats, failures, derived advice."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tui.suite.report import build_report
from tui.suite.synthetic import record

GIB = 2 ** 30


def write(results: Path, records: list[dict]) -> None:
    for r in records:
        (results / r["run_id"]).mkdir(parents=True, exist_ok=True)
        (results / r["run_id"] / "result.json").write_text(json.dumps(r))


def section(md: str, heading: str) -> str:
    return md.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


@pytest.fixture
def report(tmp_path):
    recs = []
    for rep, (d, z) in enumerate([(1000.0, 800.0), (1100.0, 820.0), (1200.0, 840.0)]):
        recs += [record("ddp", 1, d, repeat=rep, peak_memory_bytes=4 * GIB, mfu=0.30, peak_flops=1e15),
                 record("zero3", 1, z, repeat=rep, peak_memory_bytes=2 * GIB, mfu=0.24, peak_flops=1e15)]
    recs += [record("ddp", 2, 2000.0, peak_memory_bytes=4 * GIB, mfu=0.28, peak_flops=1e15),
             record("zero3", 2, 1200.0, peak_memory_bytes=1 * GIB, mfu=0.17, peak_flops=1e15),
             record("fsdp", 2, 5.0, status="oom", error="CUDA out of memory. Tried to allocate 2.00 GiB")]
    write(tmp_path / "results", recs)
    rep = build_report(tmp_path / "results", tmp_path / "out")
    return rep, rep.markdown.read_text()


def test_winners_and_margins(report):
    _, md = report
    rows = [r for r in section(md, "Winners").splitlines() if r.startswith("| throughput")]
    # 1 device: ddp mean 1100 vs zero3 mean 820 -> 34.1% higher
    assert rows[0].split("|")[3].strip() == "**ddp**" and "34.1%" in rows[0]
    # 2 devices: ddp 2000 vs zero3 1200 -> 66.7%
    assert "**ddp**" in rows[1] and "66.7%" in rows[1]
    memory = [r for r in section(md, "Winners").splitlines() if r.startswith("| memory")]
    # zero3 1 GiB vs ddp 4 GiB at 2 devices: 300% more for the runner-up
    assert "**zero3**" in memory[1] and "300.0%" in memory[1]


def test_repeats_show_mean_and_spread(report):
    rep, md = report
    ddp1 = [r for r in section(md, "Results").splitlines() if r.startswith("| ddp | 1 |")][0]
    assert "1,100 ± 100" in ddp1 and "| 3 |" in ddp1
    assert (rep.markdown.parent / "plots" / "mfu.png").exists()  # MFU known -> plotted


def test_failed_runs_and_derived_recommendations(report):
    rep, md = report
    assert rep.failed == 1
    failed = section(md, "Failed runs")
    assert "fsdp-w2-s64-mb4-ga1-r0" in failed and "oom" in failed and "CUDA out of memory" in failed
    recs = section(md, "Recommendations")
    assert "For speed at 2 devices use **ddp**: 2,000 tok/s, 66.7% above zero3" in recs
    assert "use **zero3**: 1.000 GiB per device at 2 devices, 75.0% less than ddp" in recs
    # scaling from the records: ddp 2000/(1100*2) = 0.91, zero3 1200/(820*2) = 0.73
    assert "**ddp** keeps 91% of linear, zero3 only 73%" in recs
    assert "oom: 1" in recs and "OOM runs need" in recs
    assert "Every point is a single run" not in recs  # the 1-device points have 3 repeats


def test_report_cli_errors(tmp_path):
    cmd = [sys.executable, "-m", "tui.suite.cli", "report"]
    proc = subprocess.run(cmd + [str(tmp_path / "none")], capture_output=True, text=True)
    assert proc.returncode == 2 and "no such results directory" in proc.stderr
    proc = subprocess.run(cmd + [str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2 and "no results" in proc.stderr
