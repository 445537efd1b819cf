"""MLflow tracking of a suite: every run of the matrix becomes one MLflow run, live.

The MLflow run is created when the run starts (RunStateChanged "running"), with the run's
settings as params, so it is RUNNING while it trains; every progress line adds `loss` and
`step_time_s` at that optimizer step (both from step 1, warm-up included; MLflow's step = the
trainer's step, so the curves line up) with the time the line arrived; at the end it gets the
record's summary numbers, tags (status, error, git commit, torch/DeepSpeed/NCCL versions, host,
device), the record and the log as artifacts, and ends FINISHED for an ok record, FAILED
otherwise. Steps no progress line reported (a run resumed from an earlier suite's checkpoint)
come from the record, stamped with its end. The live `loss` is rank 0's, as the progress line
carries it; the record's mean over ranks is `final_loss` and result.json's `loss_per_step`.

Where: a local file store under the results directory (`<results>/mlruns`) by default, or any
tracking server with `shardbench run --mlflow-uri http://host:5000`. The client is mlflow-skinny
(the optional `tracking` extra), so the base install stays light. Tracking never costs a result:
a run that cannot be logged is one warning line, and the matrix goes on.

The tracker is an event sink (suite/execute/events.py). Events come from the thread that reads the
ranks' output, which must never wait on a server: MLflow calls run on the tracker's own thread,
in order, and per-step points go out in batches at most every FLUSH_S. RunFinished (emitted
after the run's result.json is on disk) waits for that run's calls to be done.
"""
from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardbench.suite.execute.events import Emit, RunFinished, RunProgress, RunQueued, RunStateChanged

REPO = Path(__file__).resolve().parents[2]
MAX_PARAM = 6000  # MLflow's limit on a param value's length
SUMMARY = ("tokens_per_s", "tokens_per_s_per_device", "mfu", "final_loss", "peak_memory_bytes",
           "model_state_bytes_per_rank", "wall_time_s", "time_to_first_step_s", "h2d_gbps", "measured_steps")
ARTIFACTS = ("result.json", "log.txt", "spec.json")


class TrackingError(Exception):
    """Tracking cannot start (no mlflow client, unreachable server): one line for the user."""


def default_uri(results: str | Path) -> str:
    return (Path(results).resolve() / "mlruns").as_uri()


def git_commit(repo: Path = REPO) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _client(uri: str):
    if uri.startswith("file:"):
        # MLflow 3 keeps its file store only on request; it is the dependency-free local default.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    # A wrong server address should fail in seconds, not after MLflow's minutes of retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise TrackingError("MLflow tracking needs the mlflow client: pip install 'shardbench[tracking]' "
                            f"(mlflow-skinny) ({exc})") from None
    return MlflowClient(tracking_uri=uri)


FLUSH_S = 1.0  # per-step points are sent at most this often per run
FINISH_WAIT_S = 120.0  # RunFinished waits this long at most for the run's MLflow calls


class Tracker:
    """Logs each run of a suite to one MLflow experiment while it runs."""

    def __init__(self, uri: str, results: str | Path, experiment: str = "shardbench",
                 warn: Callable[[str], None] = lambda text: None):
        self.uri, self.results, self.warn = uri, Path(results), warn
        self.client = _client(uri)
        try:
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
        except Exception as exc:  # noqa: BLE001 - whatever the store says, said in one line
            raise TrackingError(f"MLflow tracking at {uri} unusable: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        self.commit = git_commit()
        self.specs: dict[str, dict] = {}
        self.skipped: set[str] = set()
        self.logged: dict[str, str] = {}  # shardbench run id -> MLflow run id (finished)
        self._live: dict[str, str] = {}  # shardbench run id -> MLflow run id (created)
        self._started: set[str] = set()
        self._points: dict[str, list] = {}  # per-step points not sent yet
        self._steps_seen: dict[str, set[int]] = {}
        self._flushed_at: dict[str, float] = {}
        self._calls: queue.Queue = queue.Queue()
        threading.Thread(target=self._work, name="mlflow", daemon=True).start()

    def wrap(self, emit: Emit) -> Emit:
        """An emit that feeds this tracker, then `emit`."""
        def both(event) -> None:
            self.on_event(event)
            emit(event)
        return both

    # -- the event thread: never waits on the server (but at a run's end) --------------------------
    def on_event(self, event) -> None:
        if isinstance(event, RunQueued):
            self.specs[event.run_id] = event.spec
        elif isinstance(event, RunStateChanged) and event.state == "skipped":
            self.skipped.add(event.run_id)  # kept from an earlier suite: logged back then
        elif isinstance(event, RunStateChanged) and event.state == "running" and event.run_id not in self._started:
            self._started.add(event.run_id)  # a fault's relaunch says "running" again: one MLflow run
            self._call(self._create, event.run_id, _now_ms())
        elif isinstance(event, RunProgress) and event.run_id in self._started:
            self._progress(event)
        elif isinstance(event, RunFinished) and event.run_id not in self.skipped:
            done = threading.Event()
            self._call(self._finish, event.run_id, event.record, done)
            if not done.wait(FINISH_WAIT_S):
                self.warn(f"mlflow: run {event.run_id} still being logged after {FINISH_WAIT_S:.0f} s")

    def _progress(self, event: RunProgress) -> None:
        run_id, ts = event.run_id, _now_ms()
        points = self._points.setdefault(run_id, [])
        if event.loss is not None:
            points.append(("loss", event.loss, ts, event.step))
        if event.step_time_s is not None:
            points.append(("step_time_s", event.step_time_s, ts, event.step))
        self._steps_seen.setdefault(run_id, set()).add(event.step)
        now = time.monotonic()
        if now - self._flushed_at.get(run_id, 0.0) >= FLUSH_S:
            self._flushed_at[run_id] = now
            self._call(self._send, run_id, self._take(run_id))

    def _take(self, run_id: str) -> list:
        points, self._points[run_id] = self._points.get(run_id, []), []
        return points

    def _call(self, fn, *args) -> None:
        self._calls.put((fn, args))

    # -- the tracker's thread: every MLflow call, in order ------------------------------------------
    def _work(self) -> None:
        while True:
            fn, args = self._calls.get()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - tracking must never cost a result
                self.warn(f"mlflow: run {args[0]}: {fn.__name__.strip('_')} failed: {type(exc).__name__}: {exc}")
            finally:
                if fn == self._finish:  # bound methods: equal, never identical
                    args[2].set()

    def _create(self, run_id: str, start_ms: int) -> None:
        from mlflow.entities import Param

        spec = self.specs.get(run_id, {})
        run = self.client.create_run(self.experiment_id, run_name=run_id, start_time=start_ms,
                                     tags=dict(self._tags(run_id, {})))
        self._live[run_id] = mid = run.info.run_id
        params = [Param(k, v) for k, v in _params(spec, {}).items()] if spec else []
        for i in range(0, len(params), 100):  # MLflow's batch limits: 100 params, 1000 metrics
            self.client.log_batch(mid, params=params[i:i + 100])

    def _send(self, run_id: str, points: list) -> None:
        from mlflow.entities import Metric

        mid = self._live.get(run_id)
        if mid is None or not points:
            return
        metrics = [Metric(k, float(v), ts, step) for k, v, ts, step in points]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(mid, metrics=metrics[i:i + 1000])

    def _finish(self, run_id: str, record: dict, done: threading.Event) -> None:
        self._send(run_id, self._take(run_id))
        self.logged[run_id] = self.log_run(run_id, self.specs.get(run_id, {}), record)

    def log_run(self, run_id: str, spec: dict, record: dict) -> str:
        """The run's end: its MLflow run (created now if it never started), the record's per-step
        values no progress line carried, the summary, tags, artifacts and the final status."""
        from mlflow.entities import Metric, Param, RunTag

        c = self.client
        mid = self._live.get(run_id)
        if mid is None:  # never reached "running" (cancelled first, or an old caller)
            mid = c.create_run(self.experiment_id, run_name=run_id, tags=dict(self._tags(run_id, record))).info.run_id
            params = [Param(k, v) for k, v in _params(spec, record).items()]
            for i in range(0, len(params), 100):
                c.log_batch(mid, params=params[i:i + 100])
        else:
            tags = [RunTag(k, v) for k, v in self._tags(run_id, record) if k.startswith(("shardbench.", "version."))]
            c.log_batch(mid, tags=tags)
        seen = self._steps_seen.get(run_id, set())
        metrics = [Metric(k, v, _ms(record), s) for k, v, s in _metrics(record, seen)]
        for i in range(0, len(metrics), 1000):
            c.log_batch(mid, metrics=metrics[i:i + 1000])
        run_dir = self.results / run_id
        for name in ARTIFACTS:
            if (run_dir / name).is_file():
                c.log_artifact(mid, str(run_dir / name))
        c.set_terminated(mid, status="FINISHED" if record.get("status") == "ok" else "FAILED")
        return mid

    def _tags(self, run_id: str, record: dict):
        yield "shardbench.run_id", run_id
        yield "mlflow.source.name", "shardbench run"
        yield "mlflow.source.type", "LOCAL"
        if self.commit:
            yield "mlflow.source.git.commit", self.commit
        for key in ("status", "config_id", "hostname", "device_name", "gpu_shape", "launcher", "strategy"):
            if record.get(key) is not None:
                yield f"shardbench.{key}", str(record[key])[:5000]
        if record.get("error"):
            yield "shardbench.error", str(record["error"])[:5000]
        for name, version in (record.get("versions") or {}).items():
            if version is not None:
                yield f"version.{name}", str(version)
        if record.get("nccl_env"):
            yield "shardbench.nccl_env", json.dumps(record["nccl_env"], sort_keys=True)[:5000]


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ms(record: dict) -> int:
    from datetime import datetime

    stamp = record.get("finished_at") or record.get("started_at")
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return _now_ms()


def _params(spec: dict, record: dict) -> dict[str, str]:
    """The run's settings: its spec (the matrix's knobs flattened), else the record's fields."""
    flat: dict[str, Any] = {k: v for k, v in spec.items() if k != "options"}
    flat.update(spec.get("options") or {})
    if not spec:  # a record without its spec (should not happen): what the record says it ran
        flat = {k: record.get(k) for k in ("strategy", "launcher", "world_size", "precision", "seq_len",
                                           "micro_batch", "grad_accum", "global_batch", "steps", "warmup_steps")}
    flat.setdefault("model", (record.get("model") or {}).get("preset"))
    return {k: (json.dumps(v) if isinstance(v, (dict, list)) else str(v))[:MAX_PARAM]
            for k, v in sorted(flat.items()) if v is not None}


def _metrics(record: dict, seen: set[int] = frozenset()):  # type: ignore[assignment]
    """(key, value, step): the loss of every step no progress line reported (step = optimizer
    step, from 1), the time of every measured step when no progress line reported one (at its
    step, counting from the first measured one: the record leaves checkpoint steps out, so these
    shift by one after each), then the summary at step 0."""
    for i, loss in enumerate(record.get("loss_per_step") or []):
        if i + 1 not in seen:
            yield "loss", float(loss), i + 1
    if not seen:
        first = (record.get("warmup_steps") or 0) + 1
        for i, dt in enumerate((record.get("step_time_s") or {}).get("all") or []):
            yield "step_time_s", float(dt), first + i
    for key in SUMMARY:
        if isinstance(record.get(key), (int, float)):
            yield key, float(record[key]), 0
    times = record.get("step_time_s") or {}
    for key in ("mean", "p50", "p90"):
        if times.get(key) is not None:
            yield f"step_time_{key}_s", float(times[key]), 0
    for op, per in (record.get("comm_per_step") or {}).items():
        yield f"comm_{op}_bytes_per_step", float(per["bytes"]), 0
        yield f"comm_{op}_calls_per_step", float(per["calls"]), 0
        if per.get("seconds") is not None:
            yield f"comm_{op}_seconds_per_step", float(per["seconds"]), 0
