"""The cluster backend: one Helm release of chart/ per run, watched as a Kubeflow MPIJob.

A run goes: `helm upgrade --install` (pyhelm3) of chart/ with values/<shape>.yaml and the run's
overrides -> watch the MPIJob (kubeflow.org/v2beta1, CustomObjectsApi) until its launcher pod
starts -> stream the launcher pod's log (CoreV1Api, follow; the log outlives the pod) into
run_dir/log.txt -> collect the record from it (tui.suite.collect) -> `helm uninstall` (kept when
the run failed and keep_failed is set). A pod that cannot start (image pull, scheduling) has its
events copied into the log, so the reason is on screen rather than a silent hang.

pyhelm3 0.5.8 traps avoided here: `disable_validation=True` splits its flag into characters (so
OpenAPI validation stays on), `repo_update` fails on helm 4 (a local chart needs no repo), and
its values merge concatenates lists (so the values are merged here and passed as one dict).
"""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from trainer.record import write_atomic
from tui.suite.collect import extract, failed_record, now_iso, parse_progress
from tui.suite.events import Emit, RunLogLine, RunProgress, RunStateChanged
from tui.suite.matrix import RunSpec, values_dir

REPO_ROOT = Path(__file__).resolve().parents[3]
MPIJOB = ("kubeflow.org", "v2beta1", "mpijobs")
# Labels the MPI Operator (v0.4+) puts on the pods of a job.
JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
# Container states that will not fix themselves: waiting longer is pointless.
STUCK_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff")


# --- pure helpers ---------------------------------------------------------------------------

def release_name(run_id: str) -> str:
    """A Helm release name for a run id: DNS-1123 label, at most 53 characters."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")[:53].rstrip("-")
    return name or "shardbench-run"


def deep_merge(base: dict, override: dict) -> dict:
    """Merge two values trees; lists and scalars of `override` replace (Helm's own rule)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def run_overrides(spec: RunSpec) -> dict[str, Any]:
    """The chart values that make the release run exactly `spec` (what `--set run.x=...` would)."""
    run = {
        "id": spec.run_id, "strategy": spec.strategy, "model": spec.model,
        "seqLen": spec.seq_len, "microBatch": spec.micro_batch, "gradAccum": spec.grad_accum,
        "globalBatch": None, "steps": spec.steps, "warmupSteps": spec.warmup_steps,
        "precision": spec.precision, "seed": spec.seed, "device": spec.device,
        "extraArgs": spec.option_args(),
    }
    return {"run": run, "launcher": spec.launcher, "workers": spec.nodes,
            "gpusPerWorker": spec.procs_per_node}


def release_values(spec: RunSpec, directory: Path | None = None) -> dict[str, Any]:
    """values/<shape>.yaml (when the run names a shape that has one) overlaid by the run's values."""
    base: dict[str, Any] = {}
    if spec.shape:
        path = (directory or values_dir()) / f"{spec.shape}.yaml"
        if path.is_file():
            base = yaml.safe_load(path.read_text()) or {}
    return deep_merge(base, run_overrides(spec))


def job_phase(mpijob: dict | None) -> str:
    """Latest true condition of an MPIJob (Created, Running, Succeeded, Failed, ...) or Pending."""
    conditions = ((mpijob or {}).get("status") or {}).get("conditions") or []
    true = [c for c in conditions if str(c.get("status")) == "True"]
    for final in ("Failed", "Succeeded"):
        if any(c.get("type") == final for c in true):
            return final
    return true[-1].get("type", "Pending") if true else "Pending"


def job_message(mpijob: dict | None) -> str:
    conditions = ((mpijob or {}).get("status") or {}).get("conditions") or []
    for c in reversed(conditions):
        if str(c.get("status")) == "True" and c.get("message"):
            return f"{c.get('type')}: {c['message']}"
    return ""


def stuck_reason(pod: dict) -> str | None:
    """Why a pod cannot start (image, config, scheduling), or None while it may still come up."""
    status = pod.get("status") or {}
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK_REASONS:
            return f"{waiting['reason']}: {waiting.get('message') or ''}".strip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and str(cond.get("status")) == "False":
            return f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".strip(": ")
    return None


def event_lines(events: list[dict], pod_name: str) -> list[str]:
    """`[event] pod: Warning Reason: message` lines for one pod, oldest first."""
    mine = [e for e in events if (e.get("involvedObject") or {}).get("name") == pod_name]
    mine.sort(key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    return [f"[event] {pod_name}: {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}"
            for e in mine]


def progress_event(run_id: str, line: str) -> RunProgress | None:
    p = parse_progress(line)
    if p is None:
        return None

    def num(key):
        v = p.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    return RunProgress(run_id, p["step"], p.get("steps") if isinstance(p.get("steps"), int) else 0,
                       num("tokens_per_s"), num("loss"), num("elapsed_s"), num("eta_s"),
                       str(p.get("phase") or ""))


def default_kubeconfig() -> str | None:
    """The kubeconfig kubectl would use: $KUBECONFIG's first file, else ~/.kube/config."""
    env = os.environ.get("KUBECONFIG")
    if env:
        first = env.split(os.pathsep)[0]
        return first if Path(first).is_file() else None
    path = Path.home() / ".kube" / "config"
    return str(path) if path.is_file() else None


def find_helm(explicit: str | None = None) -> str | None:
    """helm to use: the explicit path, $SHARDBENCH_HELM, PATH, then the repo's .tools/bin."""
    for candidate in (explicit, os.environ.get("SHARDBENCH_HELM")):
        if candidate:
            return candidate if Path(candidate).is_file() else shutil.which(candidate)
    found = shutil.which("helm")
    tools = REPO_ROOT / ".tools" / "bin" / "helm"
    return found or (str(tools) if tools.exists() else None)


# --- the backend ----------------------------------------------------------------------------

class KubeBackend:
    """Runs each RunSpec as a Helm release of chart/ on the cluster of a kubeconfig."""

    name = "kubernetes"

    def __init__(self, kubeconfig: str | None = None, context: str | None = None,
                 namespace: str | None = None, chart: str | Path | None = None,
                 helm: str | None = None, values_directory: Path | None = None,
                 keep_failed: bool = False, start_timeout_s: float = 900.0,
                 poll_s: float = 2.0, server_side: str | None = None):
        self.kubeconfig = kubeconfig
        self.context = context
        self.namespace = namespace
        """Namespace of the releases (must exist); None: the kubeconfig context's, else default."""
        self.chart = Path(chart or os.environ.get("SHARDBENCH_CHART") or REPO_ROOT / "chart")
        """The chart to install: the argument, $SHARDBENCH_CHART, else chart/ of this checkout."""
        self.helm = helm
        self.values_directory = values_directory
        self.keep_failed = keep_failed
        """Keep the release of a failed run for inspection (kubectl describe, logs)."""
        self.start_timeout_s = start_timeout_s
        """Seconds the launcher pod may take to start (image pull of a multi-GB image included)."""
        self.poll_s = poll_s
        self.server_side = server_side
        """helm 4 --server-side (None: helm's default); ignored by helm 3."""
        self._api = None

    # -- availability -------------------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        helm = find_helm(self.helm)
        if helm is None:
            return False, "helm not found on PATH or in .tools/bin (run `make tools`)"
        if not (self.chart / "Chart.yaml").is_file():
            return False, (f"no chart at {self.chart}: run from a shardbench checkout or set "
                           "SHARDBENCH_CHART to its chart/ directory")
        try:
            api = self.api()
        except Exception as exc:  # noqa: BLE001 - any config problem means "not available"
            return False, str(exc).splitlines()[0]
        from kubernetes import client

        try:
            client.VersionApi(api).get_code(_request_timeout=5, _preload_content=False).release_conn()
        except Exception as exc:  # noqa: BLE001
            host = api.configuration.host
            return False, f"cluster at {host} unreachable: {type(exc).__name__}: {_short(exc)}"
        try:
            group, version, plural = MPIJOB
            found = client.CustomObjectsApi(api).get_api_resources(group, version, _request_timeout=5)
            names = [r.name for r in (found.resources or [])]
        except Exception:  # noqa: BLE001 - 404: the group is not served
            names = []
        if plural not in names:
            return False, "MPI Operator not installed: the cluster serves no kubeflow.org/v2beta1 mpijobs"
        return True, ""

    def api(self):
        """A Kubernetes ApiClient for this backend's kubeconfig (raises with a one-line reason)."""
        if self._api is not None:
            return self._api
        from kubernetes import config

        path = self.kubeconfig or default_kubeconfig()
        if path is None:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
                from kubernetes import client

                self._api = client.ApiClient()
                return self._api
            raise RuntimeError("no kubeconfig: set KUBECONFIG or create ~/.kube/config")
        try:
            self._api = config.new_client_from_config(config_file=path, context=self.context)
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"kubeconfig {path} unusable: {_short(exc)}") from None
        if self.namespace is None:
            self.namespace = _context_namespace(path, self.context)
        return self._api

    # -- one run ------------------------------------------------------------------------------
    def run(self, spec: RunSpec, run_dir: Path, emit: Emit, cancel: threading.Event,
            timeout_s: float | None) -> dict[str, Any]:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = _RunLog(run_dir / "log.txt", spec.run_id, emit)
        started = now_iso()
        release = release_name(spec.run_id)
        try:
            record = _Run(self, spec, release, log, emit, cancel, timeout_s).execute()
        except Exception as exc:  # noqa: BLE001 - a run's failure, never the matrix's
            log.line(f"[shardbench] {type(exc).__name__}: {_short(exc)}")
            record = failed_record(spec, f"kubernetes backend: {type(exc).__name__}: {_short(exc)}")
            self._cleanup(release, record, log)
        finally:
            log.close()  # an abandoned log stream writes nothing after this
        record["started_at"] = record.get("started_at") or started
        if not record.get("run_id"):
            record["run_id"] = spec.run_id
        write_atomic(record, str(run_dir / "result.json"))
        return record

    def _cleanup(self, release: str, record: dict, log: "_RunLog") -> None:
        # A cancelled run is always uninstalled: the person asked for it to stop, not to debug it.
        cancelled = "cancelled" in str(record.get("error") or "")
        if record.get("status") != "ok" and self.keep_failed and not cancelled:
            log.line(f"[shardbench] kept release {release} (keep_failed): `helm uninstall {release}` when done")
            return
        try:
            self.helm_call("uninstall_release", release, namespace=self.namespace, wait=False)
            log.line(f"[shardbench] uninstalled release {release}")
        except Exception as exc:  # noqa: BLE001
            log.line(f"[shardbench] could not uninstall {release}: {_short(exc)}")

    # -- helm through pyhelm3 -----------------------------------------------------------------
    def helm_client(self):
        from pyhelm3 import Client

        helm = find_helm(self.helm)
        if helm is None:
            raise RuntimeError("helm not found on PATH or in .tools/bin (run `make tools`)")
        self.api()  # resolves the namespace and fails early without a kubeconfig
        return Client(executable=helm, kubeconfig=self.kubeconfig or default_kubeconfig(),
                      kubecontext=self.context)

    def helm_call(self, method: str, *args, **kwargs):
        """Run one async pyhelm3 Client method to completion from this (worker) thread."""
        async def call():
            return await getattr(self.helm_client(), method)(*args, **kwargs)

        return asyncio.run(call())

    def install(self, spec: RunSpec, release: str) -> list[dict]:
        """Install (or upgrade) the run's release; returns the rendered resources."""
        values = release_values(spec, self.values_directory)

        async def go():
            client = self.helm_client()
            chart = await client.get_chart(self.chart)
            revision = await client.install_or_upgrade_release(
                release, chart, values, namespace=self.namespace, create_namespace=False,
                server_side=self.server_side, wait=False)
            return list(revision.resources_ or [])

        return asyncio.run(go())


class _RunLog:
    """run_dir/log.txt plus the RunLogLine / RunProgress events of every line written to it."""

    def __init__(self, path: Path, run_id: str, emit: Emit):
        self.path, self.run_id, self.emit = path, run_id, emit
        # Line-buffered: the file is complete up to the last line whenever someone reads it.
        self._fh = open(path, "w", encoding="utf-8", errors="replace", buffering=1)
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.write(text + "\n")
        self.emit(RunLogLine(self.run_id, text))
        prog = progress_event(self.run_id, text)
        if prog is not None:
            self.emit(prog)

    def text(self) -> bytes:
        with self._lock:
            self._fh.flush()
        return self.path.read_bytes()

    def close(self) -> None:
        with self._lock:
            self._fh.close()


class _Run:
    """The life of one release: install, wait for the launcher, stream, collect, uninstall."""

    def __init__(self, backend: KubeBackend, spec: RunSpec, release: str, log: _RunLog, emit: Emit,
                 cancel: threading.Event, timeout_s: float | None):
        self.b, self.spec, self.release, self.log = backend, spec, release, log
        self.emit, self.cancel = emit, cancel
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        self.job: dict | None = None
        self.job_name = release
        self.namespace = backend.namespace or "default"
        self._job_lock = threading.Lock()
        self._stop_watch = threading.Event()

    def execute(self) -> dict[str, Any]:
        self.b.api()  # resolves the namespace from the kubeconfig context
        self.namespace = self.b.namespace or "default"
        self.emit(RunStateChanged(self.spec.run_id, "installing", f"helm release {self.release}"))
        self.log.line(f"[shardbench] helm upgrade --install {self.release} {self.b.chart} "
                      f"(namespace {self.namespace}, shape {self.spec.shape})")
        resources = self.b.install(self.spec, self.release)
        self.namespace = self.b.namespace or "default"
        self.job_name = next((r["metadata"]["name"] for r in resources
                              if r and r.get("kind") == "MPIJob"), self.release)
        watcher = threading.Thread(target=self._watch_job, daemon=True, name=f"watch-{self.release}")
        watcher.start()
        try:
            record = self._follow()
        finally:
            self._stop_watch.set()
        self.b._cleanup(self.release, record, self.log)
        return record

    # -- MPIJob status ------------------------------------------------------------------------
    def _watch_job(self) -> None:
        """Keep self.job current from a watch on the run's MPIJob (re-opened when it drops)."""
        from kubernetes import client, watch

        api = client.CustomObjectsApi(self.b.api())
        group, version, plural = MPIJOB
        while not self._stop_watch.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(api.list_namespaced_custom_object, group, version, self.namespace,
                                      plural, field_selector=f"metadata.name={self.job_name}",
                                      timeout_seconds=max(1, int(self.b.poll_s * 5)),
                                      _request_timeout=self.b.poll_s * 5 + 5):
                    obj = event.get("object") or {}
                    if (obj.get("metadata") or {}).get("name") != self.job_name:
                        continue  # a server that ignores fieldSelector sends every job
                    with self._job_lock:
                        self.job = None if event.get("type") == "DELETED" else obj
                    if self._stop_watch.is_set():
                        break
            except Exception:  # noqa: BLE001 - read timeouts and dropped streams: watch again
                self._stop_watch.wait(self.b.poll_s)
            finally:
                w.stop()

    def phase(self) -> str:
        with self._job_lock:
            return job_phase(self.job)

    # -- launcher pod -------------------------------------------------------------------------
    def _pods(self) -> list[dict]:
        from kubernetes import client

        core = client.CoreV1Api(self.b.api())
        resp = core.list_namespaced_pod(self.namespace, label_selector=f"{JOB_LABEL}={self.job_name}",
                                        _preload_content=False, _request_timeout=30)
        items = _json(resp).get("items") or []
        # Filter here too: the selector is a request, some servers answer with every pod.
        return [p for p in items if ((p.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) == self.job_name]

    def _launcher(self, pods: list[dict]) -> dict | None:
        for pod in pods:
            if ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) == "launcher":
                return pod
        return None

    def _show_events(self, pod: dict, reason: str, shown: dict) -> None:
        from kubernetes import client

        name = pod["metadata"]["name"]
        if name in shown:
            return
        shown[name] = reason
        self.log.line(f"[shardbench] pod {name} cannot start: {reason}")
        core = client.CoreV1Api(self.b.api())
        try:
            resp = core.list_namespaced_event(self.namespace, field_selector=f"involvedObject.name={name}",
                                              _preload_content=False, _request_timeout=30)
            for text in event_lines(_json(resp).get("items") or [], name):
                self.log.line(text)
        except Exception as exc:  # noqa: BLE001
            self.log.line(f"[shardbench] no events for {name}: {_short(exc)}")

    def _stopped(self) -> str | None:
        if self.cancel.is_set():
            return "cancelled"
        if self.deadline is not None and time.monotonic() > self.deadline:
            return "timeout"
        return None

    def _wait_for_launcher(self) -> tuple[dict | None, str | None]:
        """(launcher pod that has started, None) or (None, why the run ends without one)."""
        start_deadline = time.monotonic() + self.b.start_timeout_s
        shown: dict[str, str] = {}
        while True:
            stop = self._stopped()
            if stop:
                return None, stop
            pods = self._pods()
            for pod in pods:
                reason = stuck_reason(pod)
                if reason:
                    self._show_events(pod, reason, shown)
            launcher = self._launcher(pods)
            if launcher and (launcher.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
                return launcher, None
            if self.phase() == "Failed":
                return None, f"MPIJob failed before its launcher started ({job_message(self.job)})"
            if shown and time.monotonic() > start_deadline:
                return None, "pods could not start: " + "; ".join(f"{k}: {v}" for k, v in sorted(shown.items()))
            if time.monotonic() > start_deadline:
                return None, f"launcher pod not running after {self.b.start_timeout_s:g} s"
            self.cancel.wait(self.b.poll_s)

    def _follow(self) -> dict[str, Any]:
        launcher, why = self._wait_for_launcher()
        if launcher is None:
            return self._ended_early(why)
        name = launcher["metadata"]["name"]
        self.emit(RunStateChanged(self.spec.run_id, "running", f"launcher pod {name}"))
        self.log.line(f"[shardbench] streaming the log of launcher pod {name}")
        pump = _LogStream(self, name)
        pump.start()
        stop = None
        while pump.is_alive():
            stop = self._stopped()
            if stop:
                break
            pump.join(self.b.poll_s)
        if stop:
            pump.abandon()
            return self._ended_early(stop)
        self._wait_final_phase()
        self.emit(RunStateChanged(self.spec.run_id, "collecting", "reading the record from the launcher log"))
        return self._collect()

    def _wait_final_phase(self) -> None:
        """Give the operator a moment to mark the job done after the launcher's log ended."""
        until = time.monotonic() + max(3 * self.b.poll_s, 5)
        while self.phase() not in ("Succeeded", "Failed") and time.monotonic() < until:
            if self.cancel.wait(0.2):
                return

    def _collect(self) -> dict[str, Any]:
        found = extract(self.log.text(), self.spec.run_id)
        if found.record is not None:
            return found.record
        phase = self.phase()
        error = found.error or "no result record in the launcher log"
        if phase == "Failed":
            error += f" (MPIJob {job_message(self.job) or 'Failed'})"
        return failed_record(self.spec, error)

    def _ended_early(self, why: str | None) -> dict[str, Any]:
        if why == "cancelled":
            return failed_record(self.spec, "cancelled by the user before the run finished")
        if why == "timeout":
            return failed_record(self.spec, f"timed out after {self.timeout_s:g} s (per-run timeout)",
                                 status="timeout")
        return failed_record(self.spec, why or "the run ended without a launcher log")


class _LogStream(threading.Thread):
    """Follows the launcher pod's log (CoreV1Api read_namespaced_pod_log, follow=True)."""

    def __init__(self, run: _Run, pod: str):
        super().__init__(daemon=True, name=f"log-{pod}")
        self.run_, self.pod = run, pod
        self._resp = None

    def run(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(self.run_.b.api())
        try:
            self._resp = core.read_namespaced_pod_log(self.pod, self.run_.namespace, follow=True,
                                                      _preload_content=False)
            pending = b""
            for chunk in self._resp.stream(4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    self.run_.log.line(raw.decode("utf-8", errors="replace").rstrip("\r"))
            if pending:
                self.run_.log.line(pending.decode("utf-8", errors="replace"))
        except Exception as exc:  # noqa: BLE001 - a dropped stream ends the log, not the app
            self.run_.log.line(f"[shardbench] launcher log stream ended: {_short(exc)}")

    def abandon(self) -> None:
        """Close the stream so the thread ends (cancel/timeout); it is a daemon either way."""
        try:
            if self._resp is not None:
                self._resp.close()
        except Exception:  # noqa: BLE001
            pass


def _json(resp) -> dict:
    import json

    try:
        return json.loads(resp.data or b"{}")
    finally:
        resp.release_conn()


def _context_namespace(path: str, context: str | None) -> str:
    try:
        cfg = yaml.safe_load(Path(path).read_text()) or {}
        name = context or cfg.get("current-context")
        for ctx in cfg.get("contexts") or []:
            if ctx.get("name") == name:
                return (ctx.get("context") or {}).get("namespace") or "default"
    except (OSError, yaml.YAMLError, AttributeError):
        pass
    return "default"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
