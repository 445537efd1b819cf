"""The ray backend on a cluster: one Helm release of chart/ per run with `ray.enabled`, a KubeRay
RayJob (ray.io/v1), followed like an MPIJob (kube/backend.py) with its submitter in the
launcher's place.

In K8sJobMode KubeRay makes a Kubernetes Job named after the RayJob whose pod runs `ray job
submit ... -- <entrypoint>` and prints the driver's output (trainer/ray_launcher.py: every rank's
lines, the record) until the job ends: that pod's log is the run's log. Before installing, the
chart is rendered (`helm template`) and its RayJob checked with the rules KubeRay's CRD schema
cannot express (suite/backends/kube/rayjob_rules.py: submissionMode, replicas...), so a job KubeRay
would mark ValidationFailed is refused with one line instead. While waiting for the submitter,
a RayJob whose jobDeploymentStatus is Failed or ValidationFailed ends the run with KubeRay's
reason; no status within no_status_s means no KubeRay operator.

Restarts are the driver's (ray.maxRestarts = the run's max_restarts), from the trainer's
checkpoints on the results volume (a fresh directory per attempt, as for an MPIJob). kill-rank:R@S
is injected as on an MPIJob, by deleting the worker pod that holds rank R once rank 0 reported
step S (a lost node): which pod that is, Ray decides, so the driver says where each rank runs (its
`rank` event: the node's IP and hostname) and the pod is the release's pod with that IP (else
that name, a pod's default hostname). KubeRay replaces the pod; the driver sees the rank's actor
die and relaunches the group. The record's `fault` is computed from the driver's events as for a
local ray run (suite/backends/ray_backend.py): the submitter's one log holds every relaunch.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import Any

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube import diagnosis as dx
from shardbench.suite.backends.kube.attempt import Attempt
from shardbench.suite.backends.kube.backend import KubeBackend
from shardbench.suite.backends.kube.values import deep_merge
from shardbench.suite.backends.ray_backend import fault_info, RayEvents
from shardbench.suite.backends.kube.rayjob_rules import RUNNABLE_MODES, rayjob_errors
from shardbench.suite.execute.collect import failed_record
from shardbench.suite.faults.grammar import kube_fault_errors
from shardbench.trainer.ray_launcher import EVENT_PREFIX

RAYJOB = ("ray.io", "v1", "rayjobs")
SUBMITTER_LABEL = "job-name"
"""The Job controller's label on the submitter Job's pods (the Job is named after the RayJob)."""
FAILED = ("Failed", "ValidationFailed")


def deployment(job: dict | None) -> str:
    return str(((job or {}).get("status") or {}).get("jobDeploymentStatus") or "")


def why_failed(job: dict | None) -> str:
    status = (job or {}).get("status") or {}
    said = "; ".join(str(status[k]) for k in ("reason", "message") if status.get(k))
    return f"RayJob {deployment(job)}" + (f": {said}" if said else "")


def list_rayjobs(api, namespace: str, selector: dict[str, str]) -> list[dict]:
    from kubernetes import client

    group, version, plural = RAYJOB
    resp = client.CustomObjectsApi(api).list_namespaced_custom_object(
        group, version, namespace, plural, label_selector=",".join(f"{k}={v}" for k, v in selector.items()),
        _preload_content=False, _request_timeout=30)
    return kapi.labelled(kapi._json(resp).get("items") or [], selector)


class RayJobAttempt(Attempt):
    KIND = "RayJob"
    RESOURCE = RAYJOB

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # The driver's events (launch, failed) as every logged line passes, read as the local
        # ray backend reads them, for the record's fault timings.
        self.events = RayEvents(self.log.reader.emit)
        self.log.reader.emit = self.events
        self.rank_nodes: dict[int, tuple[str, str]] = {}
        """Rank -> (hostname, IP) of its node in the driver's first group (its `rank` events)."""

    def values(self) -> dict[str, Any]:
        # The MPIJob's values (run, image, this attempt's checkpoint directory; the matrix lays the
        # run out over the shape's nodes: MatrixSpec.ray_cluster) with the RayJob switched on.
        values = super().values()
        mode = (values.get("rdma") or {}).get("mode", "none")
        if mode != "none":  # the chart refuses a RayJob on an RDMA mode: sockets, said out loud
            self.log.line(f"[shardbench] warning: shape {self.spec.shape} has rdma.mode {mode}, which the RayJob's "
                          "pods are not wired for: NCCL uses TCP sockets between nodes (rdma.mode none), so "
                          "its numbers are not comparable with the MPIJob's")
        return deep_merge(values, {"launcher": "mpirun",  # the chart's; a RayJob's trainer is told ray
                                   "ray": {"enabled": True, "maxRestarts": self.spec.max_restarts},
                                   "rdma": {"mode": "none"}})

    def precheck(self, values: dict[str, Any]) -> dict[str, Any] | None:
        refused = kube_fault_errors(self.spec.fault)
        if refused:
            return failed_record(self.spec, refused[0])
        mode = (values.get("ray") or {}).get("submissionMode", "K8sJobMode")
        if mode not in RUNNABLE_MODES:
            return failed_record(self.spec, f"ray.submissionMode {mode!r}: use one of {', '.join(RUNNABLE_MODES)}")
        rendered = self.b.helm_client().template(self.b.chart, self.release, values, self.namespace)
        job = next((r for r in rendered if r and r.get("kind") == self.KIND), None)
        errors = ["the chart rendered no RayJob"] if job is None else rayjob_errors(job)
        if errors:
            return failed_record(self.spec, "RayJob refused before install: " + "; ".join(errors))
        return None

    def _pods(self) -> list[dict]:
        return kapi.list_pods(self.api, self.namespace, {SUBMITTER_LABEL: self.job_name})

    def _launcher_of(self, pods: list[dict]) -> dict | None:
        return pods[0] if pods else None

    def _leftovers(self) -> list[str]:
        selector = {dx.INSTANCE_LABEL: self.release}
        jobs = list_rayjobs(self.api, self.namespace, selector)
        pods = kapi.list_pods(self.api, self.namespace, selector)
        return [f"rayjob/{dx.name_of(j)}" for j in jobs] + [f"pod/{dx.name_of(p)}" for p in pods]

    def _cannot_start(self, pods: list[dict]) -> str | None:
        job = self.watch.job if self.watch else None
        if deployment(job) in FAILED:
            return f"{why_failed(job)} (before its submitter started)"
        for pod in pods + kapi.list_pods(self.api, self.namespace, {dx.INSTANCE_LABEL: self.release}):
            failure = self._pod_failure(pod)
            if failure:
                self._show_events(dx.name_of(pod))
                return f"pod {dx.name_of(pod)} failed before the run started: {failure}"
        if not deployment(job) and time.monotonic() - self.installed_at > self.b.no_status_s:
            return (f"RayJob {self.job_name} has no status {self.b.no_status_s:g} s after install: the KubeRay "
                    f"operator is not running or does not watch namespace {self.namespace}")
        return None

    FINAL_PHASES = ("Complete", *FAILED)
    LOG_SOURCE = "the submitter's log"

    def _phase(self) -> str | None:
        return deployment(self.watch.job)  # type: ignore[union-attr]

    def _failure_note(self) -> str | None:
        return why_failed(self.watch.job) if deployment(self.watch.job) in FAILED else None  # type: ignore[union-attr]

    # -- kill-rank: the pod Ray put the rank on --------------------------------------------
    def _on_line(self, text: str) -> None:
        if not text.startswith(EVENT_PREFIX):
            return
        try:
            info = json.loads(text[len(EVENT_PREFIX):])
            if info.get("event") == "rank" and info.get("attempt") == 0:
                self.rank_nodes[int(info["rank"])] = (str(info.get("host") or ""), str(info.get("ip") or ""))
        except (ValueError, TypeError, KeyError):
            pass  # not an event of ours: the run goes on

    def _fault_target(self):
        return self._rank_pod

    def _rank_pod(self) -> str:
        """The release's pod on the node of the fault's rank: by IP, else by name (hostname)."""
        host, ip = self.rank_nodes.get(self.fault.rank, ("", ""))  # type: ignore[arg-type,union-attr]
        pods = kapi.list_pods(self.api, self.namespace, {dx.INSTANCE_LABEL: self.release})
        by_ip = [dx.name_of(p) for p in pods if ip and (p.get("status") or {}).get("podIP") == ip]
        by_name = [dx.name_of(p) for p in pods if host and dx.name_of(p) == host]
        return (by_ip or by_name or [""])[0]

    def _replacement_failure(self) -> str | None:
        return None  # KubeRay replaces a deleted worker pod; the driver judges the relaunch

    def _with_fault(self, record: dict[str, Any], launches: list) -> dict[str, Any]:
        if launches:
            record["fault"] = asdict(fault_info(self.spec, record, launches[0][1], self.events, self.began))
        return record


class KubeRayBackend(KubeBackend):
    """Backend ray with --ray-cluster: each run a RayJob of the chart on a KubeRay cluster."""

    name = "ray"
    attempt_class = RayJobAttempt

    def availability(self) -> tuple[bool, str]:
        ok, why = super().availability()
        if not ok and not why.startswith("MPI Operator"):
            return ok, why
        if not kapi.serves(self.api(), RAYJOB):
            return False, "KubeRay not installed: the cluster serves no ray.io/v1 rayjobs"
        return True, ""
