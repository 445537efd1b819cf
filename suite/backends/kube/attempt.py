"""One attempt at a run on the cluster (kube/backend.py's KubeBackend makes one per run).

It goes: remove what a kept earlier attempt of the same run left (so its launcher log can
never be read as this attempt's) -> `helm upgrade --install` -> wait for the launcher pod to run,
within the start timeout (scheduling and image pulls), failing at once with the reason when a
pod failed, was refused, or no operator answers -> stream the launcher's log into run_dir/log.txt
(resumed when the connection drops) within the run timeout -> collect the record from the log ->
`helm uninstall` through the backend (kept when the run failed and keep_failed is set).

A run with a fault (kill-rank:R@S, kube/faults.py) deletes rank R's worker pod at step S, then
follows each retried launcher pod of the same MPIJob until one prints the record or the MPIJob
fails, and returns one record for all launches (shardbench.suite.faults.restart.merge).
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube import diagnosis as dx
from shardbench.suite.backends.kube import storage
from shardbench.suite.backends.kube.errors import FATAL, status_of
from shardbench.suite.backends.kube.pod_faults import LaunchWatch, replacement_failure, worker_pod
from shardbench.suite.backends.kube.overrides import attempt_values
from shardbench.suite.backends.kube.ownership import not_ours
from shardbench.suite.backends.kube.values import deep_merge, release_values
from shardbench.suite.backends.kube.watch import JobWatch, LauncherLog
from shardbench.suite.execute.collect import extract, failed_record
from shardbench.suite.execute.events import Emit, RunStateChanged
from shardbench.suite.faults.restart import merge, parse_fault
from shardbench.suite.matrix.expand import RunSpec
from shardbench.suite.execute.startup import StampClock

if TYPE_CHECKING:  # annotations only: backend.py imports this module for its attempt_class
    from shardbench.suite.backends.kube.backend import KubeBackend, RunLog


WORKERS_WAITING = "shardbench-entrypoint: waiting for "
WORKERS_READY = "shardbench-entrypoint: every worker answers ssh"
"""What docker/entrypoint.sh prints while it waits for a worker's ssh and once it may start
mpirun: the wait between (bounded by workerWaitSeconds, the start timeout) is not run time."""


class Attempt:
    """One attempt at a run: clear the old one, install, wait for the launcher, stream, collect.
    The job kind and its launcher pod are hooks (KIND, RESOURCE, values, precheck, _launcher_of):
    kube/rayjob.py follows a KubeRay RayJob's submitter the same way."""

    KIND = "MPIJob"
    RESOURCE = kapi.MPIJOB

    def __init__(self, backend: KubeBackend, spec: RunSpec, release: str, log: RunLog, emit: Emit,
                 cancel: threading.Event, timeout_s: float | None):
        self.b, self.spec, self.release, self.log = backend, spec, release, log
        self.emit, self.cancel, self.timeout_s = emit, cancel, timeout_s
        self.api = backend.api()  # also resolves the namespace from the kubeconfig context
        self.namespace = backend.namespace or "default"
        self.job_name = release
        self.watch: JobWatch | None = None
        self.installed_at = time.monotonic()
        self.start_s: float | None = None  # install -> launcher running
        self.fault = parse_fault(spec.fault)
        self.began = time.time()  # the fault record's total wall time counts from here
        self.claim: str | None = None  # the results volume's claim, when the release mounts one
        self.volume_waiting: str | None = None  # why that volume is not usable yet
        self.kill: tuple[LaunchWatch, str] | None = None  # kill-rank's watch and the pod it deletes
        self.workers_waiting = False  # the launcher's entrypoint said it waits for a worker's ssh
        self.workers_ready_at: float | None = None  # ... and then that every worker answers
        self.stamps = StampClock(spec.world_size)  # launcher_startup_s from the first launch's start stamps

    def execute(self) -> dict[str, Any]:
        self.emit(RunStateChanged(self.spec.run_id, "installing", f"helm release {self.release}"))
        try:
            foreign = not_ours(self.api, self.namespace, self.release, self.spec.run_id)
        except Exception as exc:  # noqa: BLE001 - returned, not raised: the error path would uninstall
            foreign = (f"cannot tell whether helm release {self.release} is this run's "
                       f"({kapi.short(exc, self.namespace)}); nothing was installed or removed")
        if foreign:  # never upgraded into shardbench, never uninstalled
            return failed_record(self.spec, foreign)
        ended = self._clear_previous_attempt()
        if ended:
            return ended
        self.log.line(f"[shardbench] helm upgrade --install {self.release} {self.b.chart} "
                      f"(namespace {self.namespace}, shape {self.spec.shape})")
        values = self.values()
        refused = self.precheck(values)
        if refused:
            return refused
        resources = self.b.helm_client().install(self.b.chart, self.release, values, self.namespace)
        self.installed_at = time.monotonic()
        self.job_name = next((r["metadata"]["name"] for r in resources if r and r.get("kind") == self.KIND),
                             self.release)
        self.claim = storage.claim_name(values, self.job_name)
        self.watch = JobWatch(self.api, self.namespace, self.job_name, self.b.poll_s, self.RESOURCE)
        self.watch.start()
        try:
            record = self._follow()
        finally:
            self.watch.stop()
        self.b.cleanup(self.release, record, self.log)
        return record

    def values(self) -> dict[str, Any]:
        values = deep_merge(release_values(self.spec, self.b.values_directory), self.b.image.values())
        return deep_merge(values, attempt_values(values, self.b.start_timeout_s, self.b.resume_checkpoints))

    def precheck(self, values: dict[str, Any]) -> dict[str, Any] | None:
        """A failed record when the run must not be installed (None: install it)."""
        return None

    def _launcher_of(self, pods: list[dict]) -> dict | None:
        return next((p for p in pods if dx.role(p) == "launcher"), None)

    # -- a rerun never reads an old attempt ---------------------------------------------------
    def _leftovers(self) -> list[str]:
        selector = {dx.INSTANCE_LABEL: self.release}
        jobs = kapi.list_mpijobs(self.api, self.namespace, selector)
        pods = kapi.list_pods(self.api, self.namespace, selector)
        return [f"mpijob/{dx.name_of(j)}" for j in jobs] + [f"pod/{dx.name_of(p)}" for p in pods]

    def _clear_previous_attempt(self) -> dict[str, Any] | None:
        """Uninstall a kept attempt of this run and wait until its MPIJob and pods are gone.

        Pod names are fixed by the job name (<job>-launcher-..., <job>-worker-i), so an old
        launcher pod left in place would be found, and its log read, as this attempt's. Waiting
        for the deletion (not only asking for it) is what makes every pod found later this one's.
        """
        left = self._leftovers()
        if not left:
            return None
        self.log.line(f"[shardbench] an earlier attempt of {self.spec.run_id} is still installed "
                      f"({', '.join(left)}): uninstalling it first")
        self.b.helm_client().uninstall(self.release, self.namespace)
        until = time.monotonic() + self.b.cleanup_timeout_s
        while left and time.monotonic() < until and not self.cancel.wait(self.b.poll_s):
            left = self._leftovers()
        if self.cancel.is_set():
            return self._cancelled()
        if left:
            return failed_record(self.spec, f"the earlier attempt of release {self.release} was not deleted "
                                            f"within {self.b.cleanup_timeout_s:g} s ({', '.join(left)}); "
                                            "delete it and run again")
        return None

    # -- waiting for the launcher (start timeout) ---------------------------------------------
    def _pods(self) -> list[dict]:
        return kapi.list_pods(self.api, self.namespace, {dx.JOB_LABEL: self.job_name})

    def _wait_for_launcher(self, done: tuple[str, ...] = ()) -> tuple[dict | None, dict | None]:
        """(the launcher pod once it runs, None) or (None, the record of a run that never will).
        `done`: launcher pods already followed (a retried launcher is a new pod of the job)."""
        deadline = time.monotonic() + self.b.start_timeout_s
        shown: dict[str, str] = {}
        while True:
            if self.cancel.is_set():
                return None, self._cancelled()
            try:
                pods = [p for p in self._pods() if dx.name_of(p) not in done]
                launcher = self._launcher_of(pods)
                if dx.launcher_started(launcher):
                    return launcher, None
                why = self._cannot_start(pods)
                if why:
                    return None, failed_record(self.spec, why)
                self._show_waiting(pods, shown)
            except Exception as exc:  # noqa: BLE001 - an API hiccup is no reason to end the run
                if status_of(exc) in FATAL:  # ... but a missing permission or namespace is
                    return None, failed_record(self.spec, f"kubernetes API: {kapi.short(exc, self.namespace)}")
                self.log.line(f"[shardbench] reading the job's pods failed ({kapi.short(exc)}); retrying")
            if time.monotonic() > deadline:
                waiting = "; ".join(f"{k}: {v}" for k, v in sorted(shown.items()))
                return None, failed_record(self.spec, self._start_timeout_reason(waiting), status="timeout")
            self.cancel.wait(self.b.poll_s)

    def _cannot_start(self, pods: list[dict]) -> str | None:
        """Why this attempt will never get a running launcher, judged from what the API shows now."""
        replaced = self._replacement_failure()
        if replaced:
            return replaced
        job = self.watch.job if self.watch else None
        if dx.job_phase(job) == "Failed":
            return f"MPIJob failed before its launcher started ({dx.job_message(job)})"
        for pod in pods:
            failure = self._pod_failure(pod)
            if failure:
                name = dx.name_of(pod)
                self._show_events(name)
                tail = kapi.log_tail(self.api, self.namespace, name, 3)  # e.g. what sshd said
                said = f"; its log ends: {' | '.join(tail)}" if tail else ""
                return f"{dx.role(pod) or 'pod'} pod {name} failed before the run started: {failure}{said}"
        names = [self.job_name, f"{self.job_name}-launcher"]
        refused = dx.rejection(dx.since(kapi.list_events(self.api, self.namespace, names), self.began), names)
        if refused:
            return f"a pod of the run was refused by the cluster: {refused}"
        fatal, waiting = storage.diagnose(self.api, self.namespace, self.claim, pods)
        if waiting and waiting != self.volume_waiting:
            self.log.line(f"[shardbench] {waiting}")
        self.volume_waiting = waiting
        if fatal:
            return fatal
        if not dx.has_status(job) and time.monotonic() - self.installed_at > self.b.no_status_s:
            return (f"MPIJob {self.job_name} has no status {self.b.no_status_s:g} s after install: the MPI "
                    f"Operator is not running or does not watch namespace {self.namespace} "
                    "(kubectl get pods -A -l app.kubernetes.io/name=mpi-operator)")
        return None

    def _pod_failure(self, pod: dict) -> str | None:
        """dx.pod_failure, with the pod's own events when the kubelet is retrying a pull or a
        container creation: they say whether the retry can succeed."""
        events: list[dict] = []
        if dx.retried(pod):
            try:
                events = dx.since(kapi.list_events(self.api, self.namespace, [dx.name_of(pod)]), self.began)
            except Exception:  # noqa: BLE001 - without events: judged on the status message alone
                pass
        return dx.pod_failure(pod, events)

    def _show_waiting(self, pods: list[dict], shown: dict[str, str]) -> None:
        """Copy each newly seen reason a pod is waiting, and its events, into the log."""
        for pod in pods:
            name, reason = dx.name_of(pod), dx.pod_waiting(pod)
            if reason and shown.get(name) != reason:
                shown[name] = reason
                self.log.line(f"[shardbench] pod {name} is waiting: {reason}")
                self._show_events(name)

    def _show_events(self, name: str) -> None:
        try:
            for text in dx.event_lines(dx.since(kapi.list_events(self.api, self.namespace, [name]), self.began), name):
                self.log.line(text)
        except Exception as exc:  # noqa: BLE001
            self.log.line(f"[shardbench] no events for {name}: {kapi.short(exc)}")

    def _start_timeout_reason(self, waiting: str) -> str:
        run = "no run timeout" if self.timeout_s is None else f"the {self.timeout_s:g} s run timeout"
        text = (f"timed out: the launcher pod was not running {self.b.start_timeout_s:g} s after install "
                f"(start timeout: scheduling and image pulls; {run} had not started)")
        if self.volume_waiting:  # the cause, when the volume is what the pods wait for
            text = f"timed out: {self.volume_waiting}; " + text.removeprefix("timed out: ")
        return f"{text}; pods waiting: {waiting}" if waiting else text

    # -- the run (run timeout) ----------------------------------------------------------------
    def _follow(self) -> dict[str, Any]:
        launcher, ended = self._wait_for_launcher()
        if launcher is None:
            return ended  # type: ignore[return-value]
        self.start_s = time.monotonic() - self.installed_at
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        launches: list[tuple[dict, LaunchWatch, float]] = []
        followed: list[str] = []
        target = self._fault_target() if self.fault else ""
        while launcher is not None:
            name = dx.name_of(launcher)
            followed.append(name)
            watch = LaunchWatch(None if launches else self.fault, self.api, self.namespace, target, self.log.line)
            if self.fault and not launches:
                self.kill = (watch, target)
            ended = self._stream(name, watch, deadline, len(launches))
            if ended:
                return ended
            launches.append(({}, watch, time.time()))
            if extract(self.log.text(), self.spec.run_id).record is not None or len(launches) > self.spec.max_restarts:
                break
            # A failed launcher with retries left: the launcher Job starts a new pod (or the
            # MPIJob fails, which ends the wait with its reason).
            self.log.line(f"[shardbench] launcher pod {name} ended without a record; waiting for the "
                          f"retried launcher ({len(launches)} of {self.spec.max_restarts} retries)")
            launcher, ended = self._wait_for_launcher(tuple(followed))
            if ended and ended.get("status") != "cancelled":
                ended["error"] = f"no retried launcher after {name} failed: {ended.get('error')}"
        self._wait_final_phase()
        self.emit(RunStateChanged(self.spec.run_id, "collecting", "reading the record from the launcher log"))
        record = ended or self._collect()
        record = self._with_fault(record, launches) if self.fault else record
        if record.get("launcher_startup_s") is None:  # as the local backend: the suite measures it
            record["launcher_startup_s"] = self.stamps.seconds()
        return record

    def _stream(self, name: str, watch: LaunchWatch, deadline: float | None, retry: int) -> dict | None:
        """Follow one launcher pod's log to its end: None, or the record of a cancel or timeout."""
        what = f"retried launcher pod {name} ({retry} of {self.spec.max_restarts})" if retry else f"launcher pod {name}"
        self.emit(RunStateChanged(self.spec.run_id, "running", what))
        after = f"{self.start_s:.0f} s after install" if not retry else "after the retry"
        self.log.line(f"[shardbench] {what} started {after}; streaming its log")

        def line(text: str) -> None:
            self.log.line(text)
            watch(text)
            if not retry:  # a relaunch's ranks start later: the fault's restart time covers them
                self.stamps.feed(text)
            self._on_line(text)
            if text.startswith(WORKERS_WAITING):
                self.workers_waiting = True
            if WORKERS_READY in text and self.workers_ready_at is None:
                self.workers_ready_at = time.monotonic()

        stream = LauncherLog(self.api, self.namespace, name, line, self.b.poll_s, self.b.log_read_timeout_s)
        stream.start()
        while stream.is_alive():
            if deadline is not None and self.workers_waiting:
                # The entrypoint's wait for the workers' ssh (bounded by the start timeout) is
                # start-up, not the run: the run timeout counts from its end.
                ready = self.workers_ready_at or time.monotonic()
                deadline = max(deadline, ready + (self.timeout_s or 0))
            if self.cancel.is_set() or (deadline is not None and time.monotonic() > deadline):
                stream.abandon()
                return self._cancelled() if self.cancel.is_set() else self._run_timed_out()
            replaced = self._replacement_failure()
            if replaced:
                stream.abandon()
                self.log.line(f"[shardbench] {replaced}")
                return failed_record(self.spec, replaced)
            stream.join(self.b.poll_s)
        return None

    def _fault_target(self):
        """The pod kill-rank deletes: the MPIJob worker that holds the rank (kube/faults.py)."""
        return worker_pod(self.job_name, self.fault.rank or 0, self.spec.procs_per_node)

    def _on_line(self, text: str) -> None:
        """Each line of the launcher's log, after it is logged (rayjob.py reads the driver's events)."""

    def _replacement_failure(self) -> str | None:
        """After kill-rank deleted a worker pod: why its replacement failed, or None (kube/faults.py)."""
        if not self.kill or self.kill[0].injected_at is None:
            return None
        return replacement_failure(self.api, self.namespace, self.kill[1], self.fault)  # type: ignore[arg-type]

    def _with_fault(self, record: dict[str, Any], launches: list[tuple[dict, LaunchWatch, float]]) -> dict[str, Any]:
        """The run's record with the fault's detection, restart and redone steps over all launches."""
        if not launches:
            return record
        attempts = []
        for k, (_, watch, ended) in enumerate(launches):
            # A launch that printed no record says where it resumed by its first step.
            mid = {"checkpoint": {"resumed_from_step": watch.resumed_from()}}
            attempts.append((record if k == len(launches) - 1 else mid, watch, ended))
        return merge(self.spec, attempts, self.began)  # type: ignore[arg-type]

    # Hooks of the job kind (rayjob.py overrides them): its final phases, where its log comes
    # from, and what its status says when it failed.
    FINAL_PHASES: tuple[str, ...] = ("Succeeded", "Failed")
    LOG_SOURCE = "the launcher log"

    def _phase(self) -> str | None:
        return dx.job_phase(self.watch.job)  # type: ignore[union-attr]

    def _failure_note(self) -> str | None:
        job = self.watch.job  # type: ignore[union-attr]
        return f"MPIJob {dx.job_message(job) or 'Failed'}" if dx.job_phase(job) == "Failed" else None

    def _wait_final_phase(self) -> None:
        """Give the operator a moment to mark the job done after the launcher's log ended."""
        until = time.monotonic() + max(3 * self.b.poll_s, 5)
        while self._phase() not in self.FINAL_PHASES and time.monotonic() < until:
            if self.cancel.wait(0.2):
                return

    def _collect(self) -> dict[str, Any]:
        found = extract(self.log.text(), self.spec.run_id)
        if found.record is not None:
            return found.record
        error = found.error or f"no result record in {self.LOG_SOURCE}"
        note = self._failure_note()
        return failed_record(self.spec, f"{error} ({note})" if note else error)

    def _cancelled(self) -> dict[str, Any]:
        return failed_record(self.spec, "cancelled by the user before the run finished", status="cancelled")

    def _run_timed_out(self) -> dict[str, Any]:
        return failed_record(
            self.spec, f"timed out: the run took longer than the {self.timeout_s:g} s run timeout (counted "
                       f"from the launcher's start, {self.start_s:.0f} s after install, or from when every worker "
                       "answered "
                       f"ssh; start timeout "
                       f"{self.b.start_timeout_s:g} s)", status="timeout")
