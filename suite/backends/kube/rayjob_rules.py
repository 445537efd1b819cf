"""Checks of a rendered KubeRay RayJob (ray.io/v1) that its CRD schema cannot make: the KubeRay
operator's own validation (ray-operator/controllers/ray/utils/validation.go, ValidateRayJobSpec,
v1.7.0) rejects these only after the object was created, as a ValidationFailed job status, and
submissionMode is a plain string in the schema. Pure: no cluster needed."""
from __future__ import annotations

from typing import Any

SUBMISSION_MODES = ("K8sJobMode", "HTTPMode", "SidecarMode", "InteractiveMode")
"""KubeRay v1.7.0's JobSubmissionMode values (rayjob_types.go)."""
RUNNABLE_MODES = ("K8sJobMode", "HTTPMode", "SidecarMode")
"""InteractiveMode waits for someone to submit the job by hand: a benchmark run would never start."""


def rayjob_errors(obj: dict[str, Any]) -> list[str]:
    """One line per rule the RayJob breaks (empty: KubeRay and shardbench accept it)."""
    spec = obj.get("spec") or {}
    errors = []
    mode = spec.get("submissionMode", "K8sJobMode")
    if mode not in SUBMISSION_MODES:
        errors.append(f"spec.submissionMode {mode!r} is not a KubeRay mode: use one of {', '.join(RUNNABLE_MODES)}")
    elif mode not in RUNNABLE_MODES:
        errors.append(f"spec.submissionMode {mode}: nothing would submit the run; use one of "
                      f"{', '.join(RUNNABLE_MODES)}")
    cluster, selector = spec.get("rayClusterSpec"), spec.get("clusterSelector")
    if not cluster and not selector:
        errors.append("spec: one of rayClusterSpec or clusterSelector must be set")
    if not spec.get("entrypoint"):
        errors.append("spec.entrypoint is empty: the driver (python -m shardbench.trainer.ray_launcher ...) must be "
                      "given")
    if spec.get("shutdownAfterJobFinishes") is False and spec.get("suspend"):
        errors.append("spec.suspend needs shutdownAfterJobFinishes true")
    if (spec.get("ttlSecondsAfterFinished") or 0) < 0:
        errors.append("spec.ttlSecondsAfterFinished must be a non-negative integer")
    if spec.get("activeDeadlineSeconds") is not None and spec["activeDeadlineSeconds"] <= 0:
        errors.append("spec.activeDeadlineSeconds must be a positive integer")
    if mode == "SidecarMode":
        if spec.get("submitterPodTemplate") or spec.get("submitterConfig"):
            errors.append("SidecarMode supports neither submitterPodTemplate nor submitterConfig")
        head = ((cluster or {}).get("headGroupSpec") or {}).get("template", {}).get("spec", {})
        if head.get("restartPolicy") not in (None, "Never"):
            errors.append("SidecarMode needs the head pod's restartPolicy Never or unset")
    if cluster:
        errors += _cluster_errors(cluster)
    return errors


def _cluster_errors(cluster: dict[str, Any]) -> list[str]:
    errors = []
    if not cluster.get("rayVersion"):
        errors.append("spec.rayClusterSpec.rayVersion is empty: give the image's Ray version")
    for group in cluster.get("workerGroupSpecs") or []:
        name = group.get("groupName", "?")
        lo, hi, n = group.get("minReplicas", 0), group.get("maxReplicas", 2**31 - 1), group.get("replicas", 0)
        if not lo <= n <= hi:
            errors.append(f"worker group {name}: replicas {n} outside [minReplicas {lo}, maxReplicas {hi}]")
    return errors
