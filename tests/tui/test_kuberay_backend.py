"""The ray backend on a cluster (--ray-cluster) against the kmock emulator (not a real API server;
see kube_emulator.py) with real helm 3 and the real chart: helm installs the chart's RayJob, the
test plays KubeRay (the RayJob's status, the submitter Job's pod and its log: the driver's
output), and the backend must follow the submitter, collect the record and uninstall. A RayJob
KubeRay would mark ValidationFailed is refused before install; a ValidationFailed status from the
operator ends the wait with its reason."""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from pathlib import Path

import kmock
import pytest

from shardbench.suite.backends import ClusterOptions, get_backend
from shardbench.suite.backends.kube.rayjob import KubeRayBackend

from shardbench.trainer.ray_launcher import EVENT_PREFIX
from shardbench.trainer.record import END_MARKER, START_MARKER

from .kube_emulator import NAMESPACE, Emulator, PodLog, install_shims, serve_log, write_kubeconfig
from .test_kube_backend import launcher_log, pod_gone, progress_line, record_for, requests, spec

HELM = Path(__file__).resolve().parents[2] / ".tools" / "helm3" / "helm"


def ray_spec():
    return replace(spec("ddp-w2-s64-mb4-ga1-0badc0de-r0"), launcher="ray", backend="ray")


def rayjobs(emu) -> dict[str, dict]:
    return {name: obj.raw for (res, ns, name), obj in emu.objects.items()
            if res.plural == "rayjobs" and ns == NAMESPACE and not obj.deleted}


async def wait_for_rayjob(emu, timeout: float = 60.0) -> dict:
    until = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < until:
        if rayjobs(emu):
            return next(iter(rayjobs(emu).values()))
        await asyncio.sleep(0.1)
    raise AssertionError("helm created no RayJob in the emulator")


async def set_status(emu, name: str, **status) -> None:
    url = f"/apis/ray.io/v1/namespaces/{NAMESPACE}/rayjobs/{name}"
    async with emu.patch(url, json={"status": status}, headers={"Content-Type": "application/merge-patch+json"}) as r:
        assert r.status == 200, await r.text()


def add_submitter(emu, job: str, phase: str = "Running") -> str:
    """The submitter Job's pod, labelled as the Job controller labels it."""
    name = f"{job}-abcde"
    emu.objects["v1/pods", NAMESPACE, name] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
            "job-name": job, "batch.kubernetes.io/job-name": job}}, "status": {"phase": phase}}
    return name


@pytest.fixture
async def cluster(tmp_path):
    assert HELM.exists(), "helm3 not installed: run `make tools` (make test does)"
    async with Emulator() as emu, emu.Server(emu) as server:
        install_shims(emu, with_mpi_operator=False)
        emu.resources["ray.io/v1/rayjobs"] = kmock.ResourceInfo(
            kind="RayJob", singular="rayjob", namespaced=True,
            verbs={"get", "list", "watch", "create", "update", "patch", "delete"})
        yield emu, write_kubeconfig(tmp_path / "kubeconfig", str(server.url))


def backend(kubeconfig) -> KubeRayBackend:
    return KubeRayBackend(kubeconfig=str(kubeconfig), helm=str(HELM), poll_s=0.2, no_status_s=5)


async def test_rayjob_installed_followed_collected_and_uninstalled(cluster, tmp_path):
    emu, kubeconfig = cluster
    s = ray_spec()

    async def kuberay():
        job = await wait_for_rayjob(emu)
        name = job["metadata"]["name"]
        await set_status(emu, name, jobDeploymentStatus="Initializing")
        await set_status(emu, name, jobDeploymentStatus="Running", jobStatus="RUNNING")
        await serve_log(emu, add_submitter(emu, name), launcher_log(s, 2468.0)).task
        await set_status(emu, name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        return job

    op = asyncio.create_task(kuberay())
    record = await asyncio.to_thread(backend(kubeconfig).run, s, tmp_path / "run", lambda e: None,
                                     threading.Event(), 60)
    job = await op
    assert record["status"] == "ok", record.get("error")
    assert record["tokens_per_s"] == 2468.0 and record["run_id"] == s.run_id
    assert job["spec"]["submissionMode"] == "K8sJobMode" and "shardbench.trainer.ray_launcher" in job["spec"]["entrypoint"]
    assert job["metadata"]["labels"]["shardbench.io/launcher"] == "ray"
    assert requests(emu, "DELETE", "/rayjobs/")  # uninstalled
    assert not [n for (res, _, n), o in emu.objects.items() if res.plural == "mpijobs"]


async def test_validation_failed_status_ends_the_wait_with_kuberays_reason(cluster, tmp_path):
    emu, kubeconfig = cluster

    async def kuberay():
        name = (await wait_for_rayjob(emu))["metadata"]["name"]
        await set_status(emu, name, jobDeploymentStatus="ValidationFailed", reason="ValidationFailed",
                         message="The RayJob spec is invalid: BackoffLimit is incompatible with InteractiveMode")

    op = asyncio.create_task(kuberay())
    record = await asyncio.to_thread(backend(kubeconfig).run, ray_spec(), tmp_path / "run", lambda e: None,
                                     threading.Event(), 60)
    await op
    assert record["status"] == "failed" and "RayJob ValidationFailed" in record["error"]
    assert "BackoffLimit is incompatible" in record["error"]


def test_a_rayjob_kuberay_would_refuse_is_never_installed(tmp_path, monkeypatch):
    b = KubeRayBackend(kubeconfig=str(write_kubeconfig(tmp_path / "kc", "http://127.0.0.1:9")), helm=str(HELM))
    monkeypatch.setattr(b, "api", lambda: object())
    from shardbench.suite.backends.kube.rayjob import RayJobAttempt

    attempt = RayJobAttempt.__new__(RayJobAttempt)
    attempt.b, attempt.spec, attempt.release, attempt.namespace = b, ray_spec(), "r", NAMESPACE
    values = attempt.values()
    assert values["ray"]["enabled"] is True and values["launcher"] == "mpirun"
    values["ray"]["submissionMode"] = "InteractiveMode"
    refused = attempt.precheck(values)
    assert refused["status"] == "failed" and "submissionMode" in refused["error"]
    attempt.spec = replace(ray_spec(), fault="stop-rank:1@3")  # needs the rank's process: not on a cluster
    assert attempt.precheck(attempt.values())["error"].startswith("fault stop-rank:1@3 cannot be injected on a cluster")


def test_ray_cluster_option_picks_the_rayjob_backend():
    assert type(get_backend("ray", ClusterOptions(), ray_cluster=True)).__name__ == "KubeRayBackend"
    assert type(get_backend("ray")).__name__ == "RayBackend"


def ray_event(kind: str, attempt: int, **extra) -> str:
    return EVENT_PREFIX + json.dumps({"event": kind, "attempt": attempt, "t": 0, **extra})


def add_worker(emu, release: str, name: str, ip: str) -> str:
    """A Ray worker pod as KubeRay makes it from the chart's template (the release's labels)."""
    emu.objects["v1/pods", NAMESPACE, name] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
            "app.kubernetes.io/instance": release, "app.kubernetes.io/component": "ray-worker"}},
        "status": {"phase": "Running", "podIP": ip}}
    return name


async def test_kill_rank_deletes_the_pod_ray_put_the_rank_on_and_the_driver_relaunches(cluster, tmp_path):
    """kill-rank:1@3 on a RayJob of 2 worker pods x 1 rank. Only the Kubernetes API is emulated
    (kmock); the test plays KubeRay and the driver's output: the driver says which node each rank
    runs on (its `rank` events; rank 1's hostname is not its pod's name, its IP is the pod's), at
    step 3 the backend deletes exactly that pod through the API, then the driver reports the
    failure, relaunches the group (resumed after the step-2 checkpoint) and prints the record.
    One record comes back with the fault fields a local ray run gets."""
    emu, kubeconfig = cluster
    s = replace(ray_spec(), nodes=2, procs_per_node=1, fault="kill-rank:1@3", max_restarts=2,
                extra_knobs=(("checkpoint_every", 2),))
    final = record_for(s, 321.0)
    final["checkpoint"] = {"resumed_from_step": 2, "restarts": 1}
    driver = lambda line: line.split(":", 1)[1] if line.startswith("[1,") else line  # noqa: E731 - unprefixed

    async def kuberay():
        job = await wait_for_rayjob(emu)
        name, release = job["metadata"]["name"], job["metadata"]["labels"]["app.kubernetes.io/instance"]
        await set_status(emu, name, jobDeploymentStatus="Running", jobStatus="RUNNING")
        pods = [add_worker(emu, release, f"{name}-ranks-worker-{x}", f"10.0.0.{i + 1}") for i, x in enumerate("ab")]
        log = PodLog(emu, add_submitter(emu, name))
        first = [ray_event("launch", 0, world_size=2, max_restarts=2),
                 ray_event("rank", 0, rank=0, host=pods[0], ip="10.0.0.1", pid=11),
                 ray_event("rank", 0, rank=1, host="ray-node-7", ip="10.0.0.2", pid=12),
                 *(driver(progress_line(i, s.steps)) for i in range(1, 4))]
        for line in first:
            log.write(line)
            await asyncio.sleep(0.05)
        for _ in range(200):  # the backend deletes rank 1's pod once it has read step 3
            if pod_gone(emu, pods[1]):
                break
            await asyncio.sleep(0.05)
        add_worker(emu, release, f"{name}-ranks-worker-c", "10.0.0.3")  # KubeRay replaces it
        await log.play([ray_event("failed", 0, reason="rank 1 lost its actor (ActorDiedError: )"),
                        ray_event("launch", 1, world_size=2, max_restarts=2),
                        *(driver(progress_line(i, s.steps)) for i in range(3, s.steps + 1)),
                        START_MARKER, json.dumps(final), END_MARKER, ray_event("done", 1)], 0.05, 0)
        await set_status(emu, name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")
        return job, pods

    op = asyncio.create_task(kuberay())
    record = await asyncio.to_thread(backend(kubeconfig).run, s, tmp_path / "run", lambda e: None,
                                     threading.Event(), 60)
    job, pods = await op
    # The RayJob checkpoints on the results volume and the driver may relaunch max_restarts times.
    entry = job["spec"]["entrypoint"]
    assert "'--max-restarts' '2'" in entry and "'--checkpoint-dir'" in entry, entry
    deleted = [r.url.path.rsplit("/", 1)[1] for r in requests(emu, "DELETE", "/pods/")]
    assert deleted == [pods[1]]  # exactly the pod of rank 1's node, once
    assert record["status"] == "ok" and record["tokens_per_s"] == 321.0, record.get("error")
    fault = record["fault"]
    assert fault["fault"] == "kill-rank:1@3" and fault["attempts"] == 2 and fault["injected_at_step"] == 3
    assert fault["steps_redone"] == 1  # step 3 again, after the step-2 checkpoint
    assert fault["detection_s"] >= 0 and fault["restart_s"] >= 0 and fault["goodput_tokens_per_s"] > 0
    log = (tmp_path / "run" / "log.txt").read_text()
    assert f"deleted worker pod {pods[1]} (it holds rank 1)" in log


async def test_a_rayjob_watch_answering_410_gone_re_lists_the_rayjob(cluster, tmp_path):
    """Every watch of the RayJob answers 410 Gone and KubeRay is slow to give it a status: the
    watch must re-list the RayJob (it listed MPIJobs, found none, and the run failed with "the
    KubeRay operator is not running")."""
    emu, kubeconfig = cluster
    s = ray_spec()
    (emu ** 1)[kmock.action.WATCH, kmock.resource("ray.io/v1/rayjobs")] << 410

    async def kuberay():
        name = (await wait_for_rayjob(emu))["metadata"]["name"]
        await set_status(emu, name, jobDeploymentStatus="Initializing")
        await asyncio.sleep(2.0)  # longer than no_status_s: only a re-list shows the status
        await set_status(emu, name, jobDeploymentStatus="Running", jobStatus="RUNNING")
        await serve_log(emu, add_submitter(emu, name), launcher_log(s, 1357.0)).task
        await set_status(emu, name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")

    op = asyncio.create_task(kuberay())
    b = KubeRayBackend(kubeconfig=str(kubeconfig), helm=str(HELM), poll_s=0.2, no_status_s=1.0)
    record = await asyncio.to_thread(b.run, s, tmp_path / "run", lambda e: None, threading.Event(), 60)
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "ok" and record["tokens_per_s"] == 1357.0, record.get("error")


def test_a_rayjob_on_an_rdma_shape_runs_over_sockets_and_says_so(monkeypatch):
    """Issue 34: the chart refuses a RayJob on an RDMA mode (its pods have no RDMA wiring); the
    RayJob backend runs it with rdma.mode none and writes why into the run's log, so a ray-vs-MPI
    comparison on that shape is not silently sockets against RDMA."""
    from types import SimpleNamespace

    from shardbench.suite.backends.kube.attempt import Attempt
    from shardbench.suite.backends.kube.rayjob import RayJobAttempt

    lines: list[str] = []
    attempt = object.__new__(RayJobAttempt)  # values() needs only the spec and the log
    attempt.spec = SimpleNamespace(shape="h100", max_restarts=1)
    attempt.log = SimpleNamespace(line=lines.append)
    monkeypatch.setattr(Attempt, "values", lambda self: {"rdma": {"mode": "host-network", "hca": {}}})
    values = attempt.values()
    assert values["rdma"] == {"mode": "none", "hca": {}} and values["ray"]["enabled"] is True
    assert len(lines) == 1 and "rdma.mode host-network" in lines[0] and "TCP sockets" in lines[0]
    monkeypatch.setattr(Attempt, "values", lambda self: {"rdma": {"mode": "none"}})
    lines.clear()
    attempt.values()
    assert lines == []
