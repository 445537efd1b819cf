"""The results volume seen from the API: why the pods that mount it cannot start.

A pod whose claim is not bound stays Pending (`pod has unbound immediate PersistentVolumeClaims`)
or, once scheduled, in ContainerCreating, whose reason Kubernetes shows only as events: the
claim's (ProvisioningFailed: no such storage class, quota) and the pod's (FailedAttachVolume
`Multi-Attach error`: a ReadWriteOnce volume already attached to another node). Without these
the run would wait out its whole start timeout and say only "not running".
"""
from __future__ import annotations

from typing import Any, Iterable

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube import diagnosis as dx

# Events that mean the volume will not come by waiting.
FATAL_CLAIM_EVENTS = ("ProvisioningFailed",)
MULTI_ATTACH = "Multi-Attach error"


def claim_name(values: dict[str, Any], job_name: str) -> str | None:
    """The claim the workers mount (the chart's <job>-results or persistence.existingClaim)."""
    persistence = values.get("persistence") or {}
    if not persistence.get("enabled"):
        return None
    return persistence.get("existingClaim") or f"{job_name}-results"


def read_claim(api, namespace: str, name: str) -> dict | None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    try:
        resp = client.CoreV1Api(api).read_namespaced_persistent_volume_claim(
            name, namespace, _preload_content=False, _request_timeout=30)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return kapi._json(resp)


def _warnings(events: Iterable[dict], name: str) -> list[dict]:
    return [e for e in events if e.get("type") == "Warning" and (e.get("involvedObject") or {}).get("name") == name]


def failure(claim_name_: str, claim: dict | None, events: Iterable[dict], pod_names: Iterable[str]) -> str | None:
    """Why the volume will never be usable by this attempt's pods, or None."""
    events = list(events)
    for event in _warnings(events, claim_name_):
        if event.get("reason") in FATAL_CLAIM_EVENTS:
            return (f"results volume claim {claim_name_} cannot be provisioned: {event.get('reason')}: "
                    f"{event.get('message', '')}")
    for pod in pod_names:
        for event in _warnings(events, pod):
            if MULTI_ATTACH in str(event.get("message") or ""):
                return (f"pod {pod} cannot attach the results volume {claim_name_}: {event.get('message')}; it is "
                        "ReadWriteOnce and attached on another node: use persistence.accessModes [ReadWriteMany]")
    return None


def pending(claim_name_: str, claim: dict | None, events: Iterable[dict]) -> str | None:
    """"claim X is Pending (not bound)" with its latest event, when it is; else None."""
    if claim is None:
        return f"results volume claim {claim_name_} does not exist"
    phase = (claim.get("status") or {}).get("phase")
    if phase != "Pending":
        return None
    said = [f"{e.get('reason')}: {e.get('message', '')}" for e in sorted(
        (e for e in events if (e.get("involvedObject") or {}).get("name") == claim_name_), key=dx._event_time)]
    return f"results volume claim {claim_name_} is Pending (not bound)" + (f": {said[-1]}" if said else "")


def diagnose(api, namespace: str, claim_name_: str | None, pods: list[dict]) -> tuple[str | None, str | None]:
    """(why the run can never start, why it is waiting) as far as the volume goes."""
    if not claim_name_:
        return None, None
    waiting = [dx.name_of(p) for p in pods if (p.get("status") or {}).get("phase") in (None, "Pending")]
    events = kapi.list_events(api, namespace, [claim_name_, *waiting])
    claim = read_claim(api, namespace, claim_name_)
    return failure(claim_name_, claim, events, waiting), pending(claim_name_, claim, events)
