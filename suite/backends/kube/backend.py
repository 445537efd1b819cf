"""The cluster backend: one Helm release of chart/ per run, followed as a Kubeflow MPIJob.

KubeBackend is the backend the runner sees: its settings, whether the cluster can run anything
(helm, chart, API, MPI Operator), the release name of a run, the API and helm clients, and one
run: an attempt (kube/attempt.py: clear, install, wait, stream, collect) writing RunLog, then
the uninstall. The backend only launches, streams and returns the record: the runner writes
result.json.

A run with a fault (kill-rank:R@S, kube/faults.py) installs with checkpoints on the results
volume and runPolicy.backoffLimit = max_restarts; its attempt follows every retried launcher.
"""
from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path
from typing import Any

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube.attempt import WORKERS_READY, WORKERS_WAITING, Attempt  # noqa: F401 - tests read the markers here
from shardbench.suite.backends.kube.helm import NOT_FOUND, REPO_ROOT, Helm, find_helm
from shardbench.suite.backends.kube.overrides import ImageChoice
from shardbench.suite.backends.kube.values import release_name
from shardbench.suite.execute.collect import failed_record, now_iso
from shardbench.suite.execute.events import Emit
from shardbench.suite.matrix.expand import RunSpec
from shardbench.suite.execute.runlines import LineReader


class KubeBackend:
    """Runs each RunSpec as a Helm release of chart/ on the cluster of a kubeconfig."""

    name = "kubernetes"
    attempt_class: type = Attempt  # kube/rayjob.py's backend swaps in its RayJobAttempt

    def __init__(self, kubeconfig: str | None = None, context: str | None = None,
                 namespace: str | None = None, chart: str | Path | None = None,
                 helm: str | None = None, values_directory: Path | None = None,
                 keep_failed: bool = False, start_timeout_s: float = 900.0,
                 poll_s: float = 2.0, server_side: str | None = None,
                 no_status_s: float = 60.0, log_read_timeout_s: float = 60.0,
                 cleanup_timeout_s: float = 180.0, image: ImageChoice | None = None,
                 resume_checkpoints: bool = False, suite: str | None = None):
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
        """Seconds from install until the launcher pod runs (scheduling, multi-GB image pulls);
        the run's own timeout starts only then."""
        self.poll_s = poll_s
        self.server_side = server_side
        """helm 4 --server-side (None: helm's default); ignored by helm 3."""
        self.no_status_s = no_status_s
        """Seconds an MPIJob may go without any status before the MPI Operator is called absent."""
        self.log_read_timeout_s = log_read_timeout_s
        """A launcher log connection silent this long is reopened (a dead connection looks silent)."""
        self.cleanup_timeout_s = cleanup_timeout_s
        """Seconds a kept earlier attempt's MPIJob and pods may take to go before a rerun gives up."""
        self.image = image or ImageChoice()
        """The image the pods run (--image...): overrides the values file's."""
        self.resume_checkpoints = resume_checkpoints
        """Continue from an earlier attempt's checkpoints instead of a fresh directory per attempt."""
        self.suite = suite or secrets.token_hex(3)
        """This suite's tag, the end of every release name it installs (kube/ownership.py)."""
        self._api = None

    # -- availability -------------------------------------------------------------------------
    def availability(self) -> tuple[bool, str]:
        if find_helm(self.helm) is None:
            return False, NOT_FOUND
        if not (self.chart / "Chart.yaml").is_file():
            return False, (f"no chart at {self.chart}: run from a shardbench checkout or set "
                           "SHARDBENCH_CHART to its chart/ directory")
        try:
            api = self.api()
        except Exception as exc:  # noqa: BLE001 - any config problem means "not available"
            return False, str(exc).splitlines()[0]
        from kubernetes import client

        try:
            client.VersionApi(api).get_code(_request_timeout=5, _preload_content=False).release_conn()  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001
            return False, f"cluster at {api.configuration.host} unreachable: {type(exc).__name__}: {kapi.short(exc)}"
        if not kapi.serves(api, kapi.MPIJOB):
            return False, "MPI Operator not installed: the cluster serves no kubeflow.org/v2beta1 mpijobs"
        return True, ""

    def release_for(self, run_id: str) -> str:
        return release_name(run_id, self.suite)

    def api(self):
        """A Kubernetes ApiClient for this backend's kubeconfig (raises with a one-line reason)."""
        if self._api is None:
            self._api, context_ns = kapi.load_client(self.kubeconfig, self.context)
            if self.namespace is None:
                self.namespace = context_ns
        return self._api

    def helm_client(self) -> Helm:
        helm = find_helm(self.helm)
        if helm is None:
            raise RuntimeError(NOT_FOUND)
        self.api()  # resolves the namespace and fails early without a kubeconfig
        return Helm(helm, self.kubeconfig or kapi.default_kubeconfig(), self.context, self.server_side)

    # -- one run ------------------------------------------------------------------------------
    def run(self, spec: RunSpec, run_dir: Path, emit: Emit, cancel: threading.Event,
            timeout_s: float | None) -> dict[str, Any]:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        log = RunLog(run_dir / "log.txt", spec.run_id, emit)
        started = now_iso()
        release = self.release_for(spec.run_id)
        try:
            record = self.attempt_class(self, spec, release, log, emit, cancel, timeout_s).execute()
        except Exception as exc:  # noqa: BLE001 - a run's failure, never the matrix's
            why = kapi.short(exc, self.namespace)
            log.line(f"[shardbench] {type(exc).__name__}: {why}")
            record = failed_record(spec, f"kubernetes backend: {type(exc).__name__}: {why}")
            self.cleanup(release, record, log)
        finally:
            log.close()  # an abandoned log stream writes nothing after this
        record["started_at"] = record.get("started_at") or started
        if not record.get("run_id"):
            record["run_id"] = spec.run_id
        return record

    def cleanup(self, release: str, record: dict, log: "RunLog") -> None:
        # A cancelled run is always uninstalled: the person asked for it to stop, not to debug it.
        if record.get("status") not in ("ok", "cancelled") and self.keep_failed:
            log.line(f"[shardbench] kept release {release} (keep_failed): `helm uninstall {release}` when done")
            return
        try:
            self.helm_client().uninstall(release, self.namespace or "default")
            log.line(f"[shardbench] uninstalled release {release}")
        except Exception as exc:  # noqa: BLE001
            log.line(f"[shardbench] could not uninstall {release}: {kapi.short(exc)}")


class RunLog:
    """run_dir/log.txt plus the RunLogLine / RunProgress events of every line written to it."""

    def __init__(self, path: Path, run_id: str, emit: Emit):
        self.path, self.run_id, self.emit = path, run_id, emit
        # Line-buffered: the file is complete up to the last line whenever someone reads it.
        self._fh = open(path, "w", encoding="utf-8", errors="replace", buffering=1)
        self._lock = threading.Lock()
        self.reader = LineReader(run_id, emit, collect=False)  # each line's events, as the local backend's

    def line(self, text: str) -> None:
        with self._lock:
            if self._fh.closed:
                return
            self._fh.write(text + "\n")
        self.reader.feed(text)

    def text(self) -> bytes:
        with self._lock:
            self._fh.flush()
        return self.path.read_bytes()

    def close(self) -> None:
        with self._lock:
            self._fh.close()
