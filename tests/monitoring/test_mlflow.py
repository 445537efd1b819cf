"""MLflow tracking of a suite against a real `mlflow server` (mlflow 3.17, from its own venv
under .tools/, as scripts/install-tools.sh installs it): `shardbench run --mlflow-uri` logs each
run, and MLflow's own client reads it back. The local default (a file store under the results)
and the failure paths are checked without a server."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.monitoring.conftest import REPO, TOOLS, free_port, tool

MLFLOW = TOOLS / "mlflow-venv" / "bin" / "mlflow"
MATRIX = ["--strategies", "ddp", "--world-sizes", "1", "--seq-lens", "64", "--steps", "6", "--warmup-steps", "2",
          "--micro-batch", "4", "--device", "cpu", "--precision", "fp32", "--repeats", "1", "--quiet",
          "--timeout-s", "180"]


def cli(*args):
    return [sys.executable, "-m", "shardbench.suite.cli", *args]


def env():
    return dict(os.environ, PYTHONWARNINGS="ignore::FutureWarning")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(tmp / "server.log", "w")
    proc = subprocess.Popen([tool(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
                             "--artifacts-destination", str(tmp / "artifacts")],
                            # MLflow 3's job runner: 7 more interpreters importing mlflow and
                            # polling (about half a core here), and a /dev/shm dir left per server.
                            # shardbench logs runs; it never runs server jobs.
                            env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180  # its imports take most of a minute on a busy 2-core machine
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(tmp / 'server.log').read_text()[-3000:]}", pytrace=False)
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the server and its uvicorn worker (a
        proc.wait(timeout=30)                # graceful stop takes half a minute; its data is scratch)


@pytest.mark.slow
def test_a_suite_run_reaches_the_mlflow_server(mlflow_server, tmp_path):
    """The MLflow run exists and is RUNNING while the run trains, with per-step points already;
    at the end it spans the run, its per-step points carry the times their steps ended, and
    `loss` and `step_time_s` are logged at the same optimizer steps (before: created after the
    run ended, every point stamped alike, step_time_s counted from 0 where loss began at 1)."""
    from datetime import datetime

    from mlflow.tracking import MlflowClient

    steps = 40
    matrix = list(MATRIX)
    matrix[matrix.index("--steps") + 1] = str(steps)
    res = tmp_path / "results"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    proc = subprocess.Popen(cli("run", "--results", str(res), "--mlflow-uri", mlflow_server,
                                "--mlflow-experiment", "e2e", *matrix),
                            cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    client = MlflowClient(tracking_uri=mlflow_server)
    live = []  # (status, points of loss) seen while the suite ran
    try:
        while proc.poll() is None:
            exp = client.get_experiment_by_name("e2e")
            for run in client.search_runs([exp.experiment_id]) if exp else []:
                live.append((run.info.status, len(client.get_metric_history(run.info.run_id, "loss"))))
            time.sleep(0.2)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out + err
    assert any(status == "RUNNING" for status, _ in live), live
    assert any(status == "RUNNING" and n > 0 for status, n in live), live  # points while it trains
    (run_dir,) = [p for p in res.iterdir() if (p / "result.json").exists()]
    record = json.loads((run_dir / "result.json").read_text())

    exp = client.get_experiment_by_name("e2e")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == record["run_id"] and run.info.status == "FINISHED"
    started = datetime.fromisoformat(record["started_at"]).timestamp()
    finished = datetime.fromisoformat(record["finished_at"]).timestamp()
    assert run.info.start_time / 1000 <= started and run.info.end_time / 1000 >= finished
    p = run.data.params
    assert (p["strategy"], p["world_size"], p["seq_len"], p["steps"], p["precision"]) == \
        ("ddp", "1", "64", str(steps), "fp32")
    losses = sorted(client.get_metric_history(run.info.run_id, "loss"), key=lambda m: m.step)
    times = sorted(client.get_metric_history(run.info.run_id, "step_time_s"), key=lambda m: m.step)
    assert [m.step for m in losses] == [m.step for m in times] == list(range(1, steps + 1))
    assert [m.value for m in losses] == pytest.approx(record["loss_per_step"], rel=1e-5)
    measured = [m.value for m in times[record["warmup_steps"]:]]  # no checkpoint steps in this run
    assert measured == pytest.approx(record["step_time_s"]["all"], abs=1e-6)
    # Each point carries the time its step ended: within the run, in step order, not all alike.
    stamps = [m.timestamp / 1000 for m in losses]
    assert stamps == sorted(stamps) and len(set(stamps)) > 1
    assert started <= stamps[0] and stamps[-1] <= finished + 1
    assert run.data.metrics["tokens_per_s"] == pytest.approx(record["tokens_per_s"])
    assert run.data.metrics["step_time_p90_s"] == pytest.approx(record["step_time_s"]["p90"])
    tags = run.data.tags
    # The checkout's commit when the suite started, or a later one (others commit meanwhile).
    commit = tags["mlflow.source.git.commit"]
    assert subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", head, commit]).returncode == 0
    assert tags["version.torch"] == record["versions"]["torch"] and tags["shardbench.status"] == "ok"
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"result.json", "log.txt", "spec.json"} <= names
    got = client.download_artifacts(run.info.run_id, "result.json", str(tmp_path))
    assert json.loads(open(got).read()) == record


@pytest.mark.slow
def test_a_failed_run_is_a_failed_mlflow_run(mlflow_server, tmp_path):
    from mlflow.tracking import MlflowClient

    from shardbench.suite.execute.events import RunFinished, RunQueued
    from shardbench.suite.execute.tracking import Tracker

    tracker = Tracker(mlflow_server, tmp_path, "failures")
    record = {"run_id": "zero3-w2-x-r0", "status": "oom", "error": "CUDA out of memory", "strategy": "zero3",
              "loss_per_step": [9.5, 9.4], "step_time_s": {"all": [0.5]}, "versions": {"torch": "2.13.0"}}
    tracker.on_event(RunQueued("zero3-w2-x-r0", 0, 1, {"strategy": "zero3", "world_size": 2, "options": {"seed": 7}}))
    tracker.on_event(RunFinished("zero3-w2-x-r0", record))
    run = MlflowClient(tracking_uri=mlflow_server).get_run(tracker.logged["zero3-w2-x-r0"])
    assert run.info.status == "FAILED" and run.data.tags["shardbench.error"] == "CUDA out of memory"
    assert run.data.params == {"strategy": "zero3", "world_size": "2", "seed": "7"}


def test_default_store_is_a_local_file_store_under_the_results(tmp_path):
    from mlflow.tracking import MlflowClient

    from shardbench.suite.execute.events import RunFinished, RunQueued, RunStateChanged
    from shardbench.suite.execute.tracking import Tracker, default_uri

    uri = default_uri(tmp_path)
    assert uri.startswith("file:") and uri.endswith("/mlruns")
    tracker = Tracker(uri, tmp_path)
    (tmp_path / "ddp-w1-r0").mkdir()
    (tmp_path / "ddp-w1-r0" / "log.txt").write_text("a log\n")
    tracker.on_event(RunQueued("ddp-w1-r0", 0, 2, {"strategy": "ddp"}))
    tracker.on_event(RunFinished("ddp-w1-r0", {"run_id": "ddp-w1-r0", "status": "ok", "tokens_per_s": 12.5,
                                                 "comm_per_step": {"all_reduce": {"calls": 2, "bytes": 4096, "seconds": 0.25}}}))
    # A run kept from an earlier suite (resume) was logged back then: not again.
    tracker.on_event(RunStateChanged("kept-r0", "skipped", "result already there (resume)"))
    tracker.on_event(RunFinished("kept-r0", {"run_id": "kept-r0", "status": "ok"}))
    assert list(tracker.logged) == ["ddp-w1-r0"]
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("shardbench").experiment_id])
    assert run.data.metrics["tokens_per_s"] == 12.5
    assert run.data.metrics["comm_all_reduce_bytes_per_step"] == 4096
    assert run.data.metrics["comm_all_reduce_seconds_per_step"] == 0.25
    assert [a.path for a in client.list_artifacts(run.info.run_id)] == ["log.txt"]


@pytest.mark.slow  # the suite CLI importing mlflow: ~8 s idle
def test_an_unreachable_server_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run(cli("run", "--results", str(tmp_path / "r"), "--mlflow-uri",
                              f"http://127.0.0.1:{free_port()}", *MATRIX),
                          cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("shardbench: MLflow tracking at http://127.0.0.1:") and "unusable" in line
    assert not (tmp_path / "r").exists() or not list((tmp_path / "r").glob("*/result.json"))
