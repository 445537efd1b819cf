"""Image pulls and container creation on the cluster (issue 34), against the kmock emulator: a
transient ErrImagePull / ImagePullBackOff / CreateContainerError (a registry's 429, a timeout on
a multi-GB pull) is waited for within the start timeout, as the kubelet retries it; a permanent
one (no such tag, no credentials, a bad name) ends the run at once with the kubelet's words.
The test plays the MPI Operator and the kubelet through the API (tests/tui/test_kube_backend.py)."""
from __future__ import annotations

import asyncio

import pytest

from shardbench.suite.backends.kube.diagnosis import pod_failure, pod_waiting

from .kube_emulator import add_event, add_pod, serve_log, set_conditions, set_pod_status, wait_for_mpijob
from .test_kube_backend import backend, cluster, helm, launcher_log, log_lines, run_in_thread, spec  # noqa: F401

HELM3 = pytest.mark.parametrize("helm", ["helm3"], indirect=True)  # one helm is enough here
IMAGE = "registry.example.com/team/shardbench:0.2.0-cu126"
TOO_MANY = f'failed to pull "{IMAGE}": unexpected status 429 Too Many Requests'
NO_TAG = (f'rpc error: code = NotFound desc = failed to pull and unpack image "{IMAGE}": failed to resolve '
          f'reference "{IMAGE}": {IMAGE}: not found')


def waiting(reason: str, message: str) -> dict:
    return {"phase": "Pending", "containerStatuses": [{"name": "launcher", "image": IMAGE, "ready": False,
                                                       "state": {"waiting": {"reason": reason, "message": message}}}]}


def warning(message: str) -> dict:
    return {"type": "Warning", "reason": "Failed", "message": message}


@pytest.mark.parametrize("reason,message,events,fatal", [
    ("ErrImagePull", TOO_MANY, [], False),
    ("ErrImagePull", "context deadline exceeded", [], False),  # a multi-GB pull timed out
    ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"', [warning(TOO_MANY)], False),
    ("CreateContainerError", "context deadline exceeded", [], False),
    ("ErrImagePull", NO_TAG, [], True),
    ("ErrImagePull", "manifest unknown: manifest tagged by \"0.2.0\" is not found", [], True),
    ("ErrImagePull", "pulling from host registry.example.com failed with status code 401 Unauthorized", [], True),
    ("ErrImagePull", "pull access denied, repository does not exist or may require authorization", [], True),
    # ImagePullBackOff's own message is only "Back-off pulling image": the pod's events say why.
    ("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"', [warning(f'Failed to pull image "{IMAGE}": {NO_TAG}')],
     True),
    ("InvalidImageName", 'Failed to apply default image tag "Bad:Name": invalid reference format', [], True),
])
def test_pull_and_create_errors_split_into_transient_and_permanent(reason, message, events, fatal):
    pod = {"status": waiting(reason, message)}
    failure = pod_failure(pod, events)
    if fatal:
        assert failure and failure.startswith("container launcher")
        assert ("not found" in failure or "Unauthorized" in failure or "denied" in failure
                or "invalid reference" in failure), failure
    else:
        assert failure is None and pod_waiting(pod).startswith(reason)


@HELM3
async def test_a_transient_pull_error_is_retried_and_the_run_goes_on(cluster, tmp_path):
    """Before: the first ErrImagePull ended the run. A registry that answers 429 twice and then
    serves the image costs the run only the wait."""
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "launcher", "Pending")
        set_pod_status(emu, pod, waiting("ErrImagePull", TOO_MANY))
        await asyncio.sleep(1.0)  # several polls of the backend (0.2 s)
        set_pod_status(emu, pod, waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'))
        add_event(emu, pod, "Failed", f'Failed to pull image "{IMAGE}": {TOO_MANY}')
        await asyncio.sleep(1.0)
        add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 8.5), delay_s=0.01).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), s, tmp_path / "run")
    await op
    assert record["status"] == "ok" and record["tokens_per_s"] == 8.5, record.get("error")
    assert any("is waiting: ErrImagePull: " in x and "429" in x for x in log_lines(tmp_path / "run"))


@HELM3
async def test_a_transient_pull_error_that_lasts_ends_at_the_start_timeout_naming_it(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "launcher", "Pending")
        set_pod_status(emu, pod, waiting("ErrImagePull", TOO_MANY))

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=2.0), s, tmp_path / "run")
    await op
    assert record["status"] == "timeout", record.get("error")
    assert "not running 2 s after install" in record["error"] and "429 Too Many Requests" in record["error"]


@HELM3
async def test_a_permanent_pull_error_seen_only_in_the_events_ends_the_run_at_once(cluster, tmp_path):
    """ImagePullBackOff says only "Back-off pulling image"; the kubelet's Failed event says the tag
    does not exist: the run fails at once (status failed, long before the 30 s start timeout)."""
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "launcher", "Pending")
        add_event(emu, pod, "Failed", f'Failed to pull image "{IMAGE}": {NO_TAG}')
        set_pod_status(emu, pod, waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"'))

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), s, tmp_path / "run")
    await op
    assert record["status"] == "failed", record.get("error")
    assert f"cannot pull image {IMAGE}: ImagePullBackOff" in record["error"] and ": not found" in record["error"]


def test_a_replacement_worker_is_judged_with_its_events_too(monkeypatch):
    """kill-rank's replacement pod: a 429 waits (None), a BackOff whose event says the tag is gone
    ends the run (the operator never recreates a failed worker)."""
    from shardbench.suite.backends.kube import api as kapi
    from shardbench.suite.backends.kube import pod_faults as faults
    from shardbench.suite.faults.grammar import parse_fault

    events: list[dict] = []
    pod = {"metadata": {"name": "w-1"}, "status": waiting("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')}
    monkeypatch.setattr(kapi, "get_pod", lambda api, ns, name: pod)
    monkeypatch.setattr(kapi, "list_events", lambda api, ns, names: events)
    monkeypatch.setattr(kapi, "log_tail", lambda api, ns, name, n: [])
    fault = parse_fault("kill-rank:1@3")
    events.append(warning(f'Failed to pull image "{IMAGE}": {TOO_MANY}'))
    assert faults.replacement_failure(None, "ns", "w-1", fault) is None
    events.append(warning(f'Failed to pull image "{IMAGE}": {NO_TAG}'))
    failed = faults.replacement_failure(None, "ns", "w-1", fault)
    assert failed and "cannot pull image" in failed and "not found" in failed
