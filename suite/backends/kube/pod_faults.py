"""The fault axis on the cluster: `kill-rank:R@S` deletes the worker pod that holds rank R.

The MPIJob's workers each run `gpusPerWorker` ranks, so rank R lives in worker pod
`<job>-worker-<R // gpusPerWorker>` (the MPI Operator's naming). Deleting it (grace period 0) is a
lost node: mpirun on the launcher loses that worker, the launcher pod fails, and with
runPolicy.backoffLimit > 0 the launcher Job starts a new launcher pod that resumes from the
checkpoints on the results volume. One `LaunchWatch` follows each launcher pod's log lines;
shardbench.suite.faults.restart.merge turns them into the run's one record with its `fault` fields, as the
local backend's fault wrapper does.
"""
from __future__ import annotations

import time

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube.diagnosis import pod_failure, retried
from shardbench.suite.execute.collect import parse_progress
from shardbench.suite.faults.grammar import Fault


def worker_pod(job_name: str, rank: int, gpus_per_worker: int) -> str:
    """The worker pod that runs `rank`."""
    return f"{job_name}-worker-{rank // max(1, gpus_per_worker)}"


class LaunchWatch:
    """One launcher pod's progress: injects the fault at its step (first launch only) and notes
    what shardbench.suite.faults.restart.merge reads (injected_at, injected_step, last_step, first_step_at)."""

    def __init__(self, fault: Fault | None, api, namespace: str, pod, say):
        # pod: its name, or a callable that names it when the fault fires (a RayJob learns where
        # its ranks run from the driver's output).
        self.fault, self.api, self.namespace, self.pod, self.say = fault, api, namespace, pod, say
        self.injected_at: float | None = None
        self.injected_step: int | None = None
        self.last_step = 0
        self.first_step: int | None = None
        self.first_step_at: float | None = None

    def __call__(self, text: str) -> None:
        progress = parse_progress(text)
        if progress is None:
            return
        step = progress["step"]
        self.last_step = max(self.last_step, step)
        if self.first_step is None:
            self.first_step, self.first_step_at = step, time.time()
        if self.fault and self.injected_at is None and step >= self.fault.step:
            self.injected_at, self.injected_step = time.time(), step
            self.say(f"[shardbench] {self._inject()}")

    def _inject(self) -> str:
        try:
            pod = self.pod() if callable(self.pod) else self.pod
            if not pod:
                return f"fault {self.fault}: no pod is known to hold rank {self.fault.rank}; nothing deleted"  # type: ignore[union-attr]
            found = kapi.delete_pod(self.api, self.namespace, pod)
        except Exception as exc:  # noqa: BLE001 - a failed injection is said, the run goes on
            return f"fault {self.fault}: deleting the worker pod of rank {self.fault.rank} failed: {kapi.short(exc)}"  # type: ignore[union-attr]
        if not found:
            return f"fault {self.fault}: worker pod {pod} not found (it already ended?)"
        return f"fault {self.fault}: deleted worker pod {pod} (it holds rank {self.fault.rank})"  # type: ignore[union-attr]

    def resumed_from(self) -> int:
        """The step this launch resumed after: its first reported step less one."""
        return max(0, (self.first_step or 1) - 1)


def replacement_failure(api, namespace: str, pod: str, fault: Fault) -> str | None:
    """Why the pod the operator made in place of the deleted worker `pod` failed, or None.

    The operator recreates a deleted worker, but never a failed one (restartPolicy Never), so a
    replacement that fails (the deleted pod's port or GPUs still held on its node) leaves every
    launcher retry without that worker: the run ends with this reason instead of waiting."""
    try:
        found = kapi.get_pod(api, namespace, pod)
    except Exception:  # noqa: BLE001 - an API hiccup: look again at the next poll
        return None
    if not found:
        return None
    events: list[dict] = []
    if retried(found):  # a pull or creation the kubelet retries: its events say whether it can succeed
        try:
            events = kapi.list_events(api, namespace, [pod])
        except Exception:  # noqa: BLE001 - judged on the status message alone
            pass
    failure = pod_failure(found, events)
    if not failure:
        return None
    tail = kapi.log_tail(api, namespace, pod, 3)
    said = f"; its log ends: {' | '.join(tail)}" if tail else ""
    return (f"replacement worker pod {pod} failed after {fault} deleted its predecessor: {failure}{said}; "
            "the MPI Operator does not recreate a failed worker, so the run cannot recover")
