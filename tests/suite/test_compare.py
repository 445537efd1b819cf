"""`shardbench compare A B` (suite/cli/compare.py): the same configurations side by side with
95% intervals, a change named significant only when its interval excludes zero and neither side
is flagged, configurations of one side listed, and what changed in the recorded software."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shardbench.trainer.record import write_atomic
from shardbench.suite.cli.compare import compare_dirs
from tests.synthetic import record

ROOT = Path(__file__).resolve().parents[2]


def write(directory: Path, runs: dict[tuple[str, int], list[float]], nccl: str, env: dict | None = None) -> Path:
    for (strategy, world), values in runs.items():
        for rep, tps in enumerate(values):
            rec = record(strategy, world, tps, repeat=rep)
            rec["versions"] = {**rec["versions"], "nccl": nccl}
            rec["nccl_env"] = env or {}
            write_atomic(rec, str(directory / rec["run_id"] / "result.json"))
    return directory


def sets(tmp_path: Path) -> tuple[Path, Path]:
    a = write(tmp_path / "before", {("ddp", 2): [1000, 1010, 990], ("zero3", 2): [800, 805, 795],
                                    ("fsdp", 2): [700, 900, 500], ("zero1", 1): [500]}, "2.21.5")
    b = write(tmp_path / "after", {("ddp", 2): [1200, 1210, 1190],  # +20%, tight: significant
                                   ("zero3", 2): [801, 790, 812],  # the same within noise
                                   ("fsdp", 2): [1400, 1420, 1380],  # A is flagged (spread 57%)
                                   ("zero2", 1): [600]}, "2.23.4", {"NCCL_ALGO": "Ring"})
    return a, b


def test_compare_names_significant_changes_only_where_intervals_allow(tmp_path):
    cmp = compare_dirs(*sets(tmp_path))
    verdicts = {(c.label, c.unit): c.verdict for c in cmp.changes}
    assert verdicts[("ddp @ 2 dev", "tok/s")] == "significant (better)"
    assert verdicts[("ddp @ 2 dev", "step s")] == "significant (better)"  # shorter steps are better
    assert verdicts[("zero3 @ 2 dev", "tok/s")] == "no significant change"
    assert verdicts[("fsdp @ 2 dev", "tok/s")].startswith("flagged in A")
    assert verdicts[("fsdp @ 2 dev", "state GiB/rank")] == "no significant change"  # counted: not blocked
    ddp = next(c for c in cmp.changes if c.label == "ddp @ 2 dev" and c.unit == "tok/s")
    assert abs(ddp.change.mean - 0.2) < 1e-9 and 0 < ddp.change.lo < 0.2 < ddp.change.hi
    assert [n.split("-")[0] for n in cmp.only_a] == ["zero1"] and [n.split("-")[0] for n in cmp.only_b] == ["zero2"]
    assert "nccl: 2.21.5 -> 2.23.4" in cmp.versions and "NCCL_ALGO: - -> Ring" in cmp.versions


def test_compare_cli_prints_the_table_and_fails_on_worse_when_asked(tmp_path):
    a, b = sets(tmp_path)
    cmd = [sys.executable, "-m", "shardbench.suite.cli", "compare"]
    out = subprocess.run(cmd + [str(a), str(b), "--csv", str(tmp_path / "c.csv")], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "+20.0% [" in out.stdout and "significant (better)" in out.stdout and "only in A: zero1" in out.stdout
    assert "configuration,label,metric,A,B" in (tmp_path / "c.csv").read_text()
    worse = subprocess.run(cmd + [str(b), str(a), "--fail-on-worse"], capture_output=True, text=True, cwd=ROOT)
    assert worse.returncode == 1 and "significant (worse)" in worse.stdout
    missing = subprocess.run(cmd + [str(tmp_path / "nope"), str(b)], capture_output=True, text=True, cwd=ROOT)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "no such results directory" in missing.stderr
