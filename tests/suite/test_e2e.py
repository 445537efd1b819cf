"""End to end on CPU: `shardbench run` (real trainer, mpirun and the DeepSpeed launcher), Ctrl-C
mid-matrix, resume, then `shardbench report`; the CSV, plots and report are checked against the
result records the runs wrote. The run order is shuffled with a fixed --order-seed, so the test
knows which runs finish first."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pandas as pd
import pytest

from shardbench.suite.execute.runner import interleaved

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "trainer/schema/result.schema.json").read_text())
PRICE = 0.5
MATRIX = ["--strategies", "ddp,zero2", "--world-sizes", "1,2", "--seq-lens", "64", "--steps", "6",
          "--warmup-steps", "2", "--micro-batch", "4", "--device", "cpu", "--precision", "fp32",
          "--usd-per-gpu-hour", str(PRICE), "--timeout-s", "180", "--repeats", "1", "--quiet", "--order-seed", "5"]


def _specs():
    from shardbench.suite.cli.commands import build_parser
    from shardbench.suite.cli.matrix_flags import effective_matrix
    from shardbench.suite.matrix.expand import expand

    specs, errors = expand(effective_matrix(build_parser().parse_args(["run", *MATRIX])))
    assert not errors
    return specs


SPECS = _specs()
RUN_IDS = [s.run_id for s in SPECS]  # ddp w1, ddp w2, zero2 w1, zero2 w2
RID = {(s.strategy, s.world_size): s.run_id for s in SPECS}
ORDER = [s.run_id for s in interleaved(SPECS, 5)]


def cli(*args):
    return [sys.executable, "-m", "shardbench.suite.cli", *args]


def finished(results: Path) -> list[str]:
    return sorted(p.parent.name for p in results.glob("*/result.json"))


def mtimes(results: Path) -> dict[str, float]:
    return {p.parent.name: p.stat().st_mtime_ns for p in results.glob("*/result.json")}


def leftovers(text: str) -> list[str]:
    out = subprocess.run(["ps", "-ww", "-eo", "pid,stat,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and " Z" not in line and "ps -ww" not in line]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Run the matrix: interrupted after two runs, resumed, then resumed again (nothing new)."""
    root = tmp_path_factory.mktemp("e2e")
    res = root / "results"
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    # 1. Ctrl-C once two runs have finished: those stay, the running one stops (cancelled), no
    #    rank survives.
    proc = subprocess.Popen(cli("run", "--results", str(res), *MATRIX), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 150
    while len(finished(res)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # let the third run start its ranks
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    interrupted = {"rc": proc.returncode, "out": out, "leftovers": leftovers(str(res)),
                   "kept": {rid: json.loads((res / rid / "result.json").read_text())["status"]
                            for rid in finished(res)}}
    before = mtimes(res)
    # 2. Resume: only what did not finish ok runs.
    resumed = subprocess.run(cli("run", "--results", str(res), *MATRIX), cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=300)
    after_resume = mtimes(res)
    # 3. Again: nothing new.
    t0 = time.monotonic()
    again = subprocess.run(cli("run", "--results", str(res), *MATRIX), cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    return {"root": root, "res": res, "interrupted": interrupted, "before": before, "resumed": resumed,
            "after_resume": after_resume, "again": again, "again_s": time.monotonic() - t0}


@pytest.fixture(scope="module")
def records(results):
    return {rid: json.loads((results["res"] / rid / "result.json").read_text()) for rid in RUN_IDS}


@pytest.fixture(scope="module")
def report(results):
    out = results["root"] / "report"
    proc = subprocess.run(cli("report", str(results["res"]), "--out", str(out)), cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_interrupt_keeps_finished_runs_and_leaves_no_ranks(results):
    it = results["interrupted"]
    assert it["rc"] == 130, it["out"]
    assert it["leftovers"] == []
    assert {rid: it["kept"][rid] for rid in ORDER[:2]} == {rid: "ok" for rid in ORDER[:2]}, it["kept"]
    assert set(it["kept"]) <= set(ORDER[:3])
    assert it["kept"].get(ORDER[2], "cancelled") in ("ok", "cancelled")
    assert "2 ok" in it["out"] or "3 ok" in it["out"]  # the summary lists every run it has


def test_resume_runs_only_the_rest_and_then_nothing(results, records):
    assert results["resumed"].returncode == 0, results["resumed"].stdout + results["resumed"].stderr
    for rid in ORDER[:2]:  # finished before Ctrl-C: untouched by the resume
        assert results["after_resume"][rid] == results["before"][rid]
    assert all(records[rid]["status"] == "ok" for rid in RUN_IDS), {r: records[r].get("error") for r in RUN_IDS}
    if results["interrupted"]["kept"].get(ORDER[2]) == "cancelled":  # the stopped attempt is kept aside
        old = json.loads((results["res"] / ORDER[2] / "attempts" / "1" / "result.json").read_text())
        assert old["status"] == "cancelled"
    assert results["again"].returncode == 0
    assert mtimes(results["res"]) == results["after_resume"]  # the third invocation ran nothing
    assert results["again_s"] < 30


def test_records_are_valid_and_comparable(records):
    for rid, rec in records.items():
        jsonschema.validate(rec, SCHEMA)
        assert rec["run_id"] == rid and rec["tokens_per_s"] > 0 and rec["measured_steps"] == 4
    assert {records[r]["launcher"] for r in RUN_IDS[:2]} == {"mpirun"}
    assert {records[r]["launcher"] for r in RUN_IDS[2:]} == {"deepspeed"}
    # same tokens, same model: every strategy reaches the same loss at a given world size
    assert records[RUN_IDS[0]]["final_loss"] == pytest.approx(records[RUN_IDS[2]]["final_loss"], rel=1e-3)
    assert records[RUN_IDS[1]]["final_loss"] == pytest.approx(records[RUN_IDS[3]]["final_loss"], rel=1e-3)


def test_csv_rows_match_the_records(report, records):
    df = pd.read_csv(report / "metrics.csv")
    assert sorted(df["run_id"]) == sorted(RUN_IDS)
    for rid, rec in records.items():
        row = df[df["run_id"] == rid].iloc[0]
        assert row["status"] == "ok" and row["world_size"] == rec["world_size"]
        assert row["tokens_per_s"] == pytest.approx(rec["tokens_per_s"])
        assert row["step_time_mean_s"] == pytest.approx(rec["step_time_s"]["mean"])
        rss = (max(m["rss_peak_bytes"] for m in rec["memory"]) if rec.get("memory")  # schema 2
               else max(m["rss_bytes"] for m in rec["peak_memory"]))
        assert row["rss_footprint_gib"] == pytest.approx(rss / 2 ** 30)
        assert row["model_state_gib_per_rank"] == pytest.approx(rec["model_state_bytes_per_rank"] / 2 ** 30)
        assert row["cost_usd_per_mtok"] == pytest.approx(PRICE * rec["world_size"] / 3600 / rec["tokens_per_s"] * 1e6)
        base = records[RID[(rec["strategy"], 1)]]["tokens_per_s"]
        assert row["scaling_efficiency"] == pytest.approx(rec["tokens_per_s"] / (base * rec["world_size"]))


def test_plots_exist(report):
    for name in ("tokens_per_s.png", "step_time.png", "scaling_efficiency.png", "model_state.png"):
        path = report / "plots" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert not (report / "plots" / "mfu.png").exists()  # CPU: no peak FLOP/s, no MFU plot


def table_rows(markdown: str, heading: str) -> list[list[str]]:
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows[2:]]


def test_report_tables_match_the_records(report, records):
    md = (report / "BENCHMARK_REPORT.md").read_text()
    results = {(r[0], r[1]): r for r in table_rows(md, "Results")}
    assert len(results) == 4
    for rid, rec in records.items():
        row = results[(rec["strategy"], str(rec["world_size"]))]
        assert row[5] == f"{rec['tokens_per_s']:,.0f} (n=1)"
        assert row[6] == f"{rec['step_time_s']['mean']:.4f} (n=1)"
    scaling = {r[0]: r for r in table_rows(md, "Scaling efficiency")}
    for strategy in ("ddp", "zero2"):
        w1, w2 = records[RID[(strategy, 1)]], records[RID[(strategy, 2)]]
        assert scaling[strategy][1:] == ["1.00 (n=1)", f"{w2['tokens_per_s'] / (2 * w1['tokens_per_s']):.2f} (n=1)"]
    # One repeat per configuration: no winner anywhere, and the report says why.
    verdicts = table_rows(md, "Verdicts")
    timed = [r for r in verdicts if not r[0].startswith("memory")]
    assert timed and all(r[2] in ("one repeat", "flagged") for r in timed), timed  # flagged: eff > 1.05
    # Every timed category is either "no winner from one repeat" or, on a loaded host, flagged: never a winner.
    assert all("no winner from one repeat" in r[3] or r[2] == "flagged" for r in timed), timed
    assert not any("**" in r[3] for r in timed)
    # Memory is counted, not timed: one repeat decides it (issue 18).
    memory = [r for r in verdicts if r[0].startswith("memory")]
    assert memory and all(r[2] in ("winner", "equal") for r in memory), memory
    assert "all 2 runs agree" in md.split("## Loss check", 1)[1]  # ddp and zero2 at each world size
    assert "None: every run finished ok." in md
    setup = dict((r[0], r[1]) for r in table_rows(md, "Setup"))
    assert records[RUN_IDS[0]]["versions"]["torch"] in setup["python / torch / deepspeed"]
    assert setup["runs"] == "4 (4 ok, 0 not ok)"
    assert "Rerun with `--repeats 3`" in md
