"""Pure helpers: what an MPIJob's status, its pods and their events say about a run.

Everything here reads plain dicts (the API's JSON) and returns a line a person can act on, so the
backend can end a run that will never start with the reason instead of waiting out a timeout.
What the MPI Operator (v2beta1) does, as read in its controller: pods get the labels below; a
worker pod the API server refuses (Pod Security admission, quota) becomes a Warning event on the
MPIJob, reason MPIJobFailed, "worker pod created failed: ..."; the launcher is a batch Job named
<job>-launcher whose refused pod becomes the Job controller's FailedCreate event on that Job; a
failed worker (restartPolicy Never) does not fail the MPIJob, and with WaitForWorkersReady the
launcher is then never created. An operator that is not running leaves the MPIJob with no status.
"""
from __future__ import annotations

from datetime import datetime

from typing import Iterable

JOB_LABEL = "training.kubeflow.org/job-name"
ROLE_LABEL = "training.kubeflow.org/job-role"
INSTANCE_LABEL = "app.kubernetes.io/instance"
"""The chart puts the release name on the MPIJob and on both pod templates."""

# A failed pull (ErrImagePull, then ImagePullBackOff) or container creation may heal (a
# registry's 429, a timeout on a multi-GB pull, containerd's "context deadline exceeded"): the
# kubelet retries, so the run waits for it within the start timeout. It ends the run at once when
# the kubelet's words (the status message, or the pod's Warning events: ImagePullBackOff's own
# message is only "Back-off pulling image") say the image or the credentials are wrong: waiting
# that out cost every run of a matrix the whole start timeout.
PULL_ERRORS = ("ErrImagePull", "ImagePullBackOff")
RETRIED_WAITING = (*PULL_ERRORS, "CreateContainerError")
PERMANENT_MESSAGES = ("manifest unknown", "not found", "notfound", "unauthorized", "forbidden", "denied",
                      "authentication required", "invalid reference format", "repository does not exist",
                      "no such host")
"""Lower-case words of a pull or create error no retry fixes (registry and containerd wording)."""
BAD_IMAGE = ("InvalidImageName", "ErrImageNeverPull")
# Waiting reasons that will not fix themselves: the run fails as soon as one is seen.
FATAL_WAITING = (*BAD_IMAGE, "CreateContainerConfigError", "CrashLoopBackOff", "RunContainerError")
# Waiting reasons that time may fix: shown in the log and counted against the start timeout.
SLOW_WAITING: tuple[str, ...] = RETRIED_WAITING
# Warning events that mean a pod was refused by the API server, so it will never exist.
REJECTION_EVENTS = ("FailedCreate", "MPIJobFailed")


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


def has_status(mpijob: dict | None) -> bool:
    """Whether an operator has ever written this MPIJob's status (conditions or replica counts)."""
    return bool((mpijob or {}).get("status"))


def role(pod: dict) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL) or "")


def name_of(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _containers(pod: dict) -> list[dict]:
    status = pod.get("status") or {}
    return (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])


def launcher_started(pod: dict | None) -> bool:
    """The launcher's container has run (its log exists): Running, Succeeded or Failed."""
    return (((pod or {}).get("status") or {}).get("phase")) in ("Running", "Succeeded", "Failed")


def launcher_finished(pod: dict | None) -> bool:
    """The launcher's log is complete: the pod is done or every container has terminated."""
    status = (pod or {}).get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    main = status.get("containerStatuses") or []
    return bool(main) and all((cs.get("state") or {}).get("terminated") for cs in main)


def retried(pod: dict) -> bool:
    """A container waits for a pull or a creation the kubelet retries: its events tell whether
    the retry can succeed (pod_failure's `events`)."""
    return any(((cs.get("state") or {}).get("waiting") or {}).get("reason") in RETRIED_WAITING
               for cs in _containers(pod))


def permanent(*texts: str | None) -> bool:
    """The kubelet's words say no retry will fix it (PERMANENT_MESSAGES)."""
    text = " ".join(t or "" for t in texts).lower()
    return any(word in text for word in PERMANENT_MESSAGES)


def pod_failure(pod: dict, events: Iterable[dict] = ()) -> str | None:
    """Why a pod has failed for good (a container exited with an error, a fatal waiting reason,
    a pull or creation error that `events` or the status message show to be permanent)."""
    warnings = [str(e.get("message") or "") for e in events if e.get("type") == "Warning"]
    for cs in _containers(pod):
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        reason = waiting.get("reason")
        if reason in BAD_IMAGE or reason in PULL_ERRORS and permanent(waiting.get("message"), *warnings):
            head = (f"container {cs.get('name')} cannot pull image {cs.get('image') or '?'}: {reason} "
                    "(set the image with --image, or --image-repository / --image-tag)")
            # ImagePullBackOff's message alone does not say why: the event that does
            said = [] if permanent(waiting.get("message")) else [m for m in warnings if permanent(m)][-1:]
            return _joined(head, " ".join([waiting.get("message") or "", *said]))
        if reason in RETRIED_WAITING and permanent(waiting.get("message"), *warnings):
            return _joined(f"container {cs.get('name')} {reason}", waiting.get("message"))
        if reason in FATAL_WAITING:
            return _joined(f"container {cs.get('name')} {waiting['reason']}", waiting.get("message"))
        done = state.get("terminated") or {}
        if done and done.get("exitCode") not in (0, None):
            head = f"container {cs.get('name')} exited with code {done['exitCode']} ({done.get('reason') or 'Error'})"
            return _joined(head, done.get("message"))
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return _joined(f"pod {status.get('reason') or 'Failed'}", status.get("message"))
    return None


def pod_waiting(pod: dict) -> str | None:
    """Why a pod is not running yet while time may still fix it (image pull, scheduling)."""
    for cs in _containers(pod):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in SLOW_WAITING and not permanent(waiting.get("message")):
            return _joined(waiting["reason"], waiting.get("message"))
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and str(cond.get("status")) == "False":
            return _joined(cond.get("reason") or "Unschedulable", cond.get("message"))
    return None


def rejection(events: Iterable[dict], names: Iterable[str]) -> str | None:
    """The latest Warning event on one of `names` saying a pod was refused, as one line."""
    wanted = set(names)
    found = [e for e in events if e.get("type") == "Warning" and e.get("reason") in REJECTION_EVENTS
             and (e.get("involvedObject") or {}).get("name") in wanted]
    if not found:
        return None
    last = max(found, key=_event_time)
    kind = (last.get("involvedObject") or {}).get("kind") or "object"
    return f"{kind} {last['involvedObject']['name']}: {last.get('reason')}: {last.get('message') or ''}".rstrip(": ")


def event_lines(events: Iterable[dict], name: str) -> list[str]:
    """`[event] name: Warning Reason: message` lines for one object, oldest first."""
    mine = sorted((e for e in events if (e.get("involvedObject") or {}).get("name") == name), key=_event_time)
    return [f"[event] {name}: {e.get('type', '')} {e.get('reason', '')}: {e.get('message', '')}" for e in mine]


def since(events: Iterable[dict], start: float) -> list[dict]:
    """The events last seen at or after `start` (epoch seconds): a rerun's own. Events of an
    earlier attempt of the same names (kept for an hour by default) must not end a new attempt
    with their old reason. Event times have whole seconds, hence the one second of slack; an event
    without a readable time is kept."""
    out = []
    for e in events:
        try:
            when = datetime.fromisoformat(_event_time(e).replace("Z", "+00:00")).timestamp()
        except ValueError:
            when = None
        if when is None or when >= start - 1.0:
            out.append(e)
    return out


def _event_time(event: dict) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or
               (event.get("metadata") or {}).get("creationTimestamp") or "")


def _joined(head: str, detail: str | None) -> str:
    detail = " ".join(str(detail or "").split())
    return f"{head}: {detail}" if detail else head
