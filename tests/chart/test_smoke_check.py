"""chart/files/smoke_check.py, the `helm test` pod's script: passes only when the trainer's record
says status ok, on stdout and in result.json. Checked against stand-in trainers that misbehave in
each way, and once for real with the command the chart's test pod renders."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from chart_helpers import CHART, render

SCRIPT = CHART / "files" / "smoke_check.py"

FAKE_TRAINER = textwrap.dedent('''
    import json, os, sys
    mode = os.environ["FAKE_MODE"]
    args = sys.argv[1:]
    out = args[args.index("--output-dir") + 1]
    record = {"run_id": "fake", "status": "failed" if mode == "failed" else "ok", "error": "boom" if mode == "failed" else None}
    if mode != "no-record":
        print("BENCHMARK_RESULT_JSON_START")
        print("{not json" if mode == "bad-json" else json.dumps(record))
        print("BENCHMARK_RESULT_JSON_END")
    if mode != "no-file":
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "result.json"), "w") as fh:
            json.dump(record, fh)
    sys.exit(1 if mode in ("failed", "exit-1") else 0)
''')


# The interpreter the venv was made from: it lacks the venv's editable-install finder, which would
# otherwise pick the real trainer over the stand-in on PYTHONPATH (so does the repo as the cwd).
BASE_PYTHON = getattr(sys, "_base_executable", None) or sys.executable


def run_check(tmp_path, mode: str) -> subprocess.CompletedProcess:
    pkg = tmp_path / "fake" / "shardbench" / "trainer"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text(FAKE_TRAINER)
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "fake"), FAKE_MODE=mode)
    return subprocess.run([BASE_PYTHON, str(SCRIPT), "--strategy", "ddp", "--output-dir", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=30, cwd=tmp_path)


def test_ok_record_passes(tmp_path):
    proc = run_check(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert '"run_id": "fake"' in proc.stdout  # the stand-in ran, not the real trainer
    assert "smoke check: ok" in proc.stdout


@pytest.mark.parametrize("mode,reason", [
    ("failed", "status 'failed': boom"),
    ("no-record", "no record between BENCHMARK_RESULT_JSON_START and BENCHMARK_RESULT_JSON_END"),
    ("bad-json", "not JSON"),
    ("no-file", "result.json missing"),
    ("exit-1", "exited 1"),
])
def test_anything_else_fails_with_one_line(tmp_path, mode, reason):
    proc = run_check(tmp_path, mode)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("smoke check:") and reason in last, proc.stderr


@pytest.mark.slow  # a real run: ~6 s idle
def test_the_rendered_test_pod_command_passes_with_the_real_trainer(tmp_path):
    pod = next(d for d in render("helm3", ("cpu.yaml",)) if d["kind"] == "Pod")
    cmd = pod["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["python", "/etc/shardbench/smoke_check.py"]
    args = cmd[2:]
    args[args.index("--output-dir") + 1] = str(tmp_path / "smoke")
    env = dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "smoke" / "result.json").is_file()
