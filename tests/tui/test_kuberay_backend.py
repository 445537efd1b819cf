"""The ray backend on a cluster (--ray-cluster) against the kmock emulator (not a real API server;
see kube_emulator.py) with real helm 3 and the real chart: helm installs the chart's RayJob, the
test plays KubeRay (the RayJob's status, the submitter Job's pod and its log: the driver's
output), and the backend must follow the submitter, collect the record and uninstall. A RayJob
KubeRay would mark ValidationFailed is refused before install; a ValidationFailed status from the
operator ends the wait with its reason."""
from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from pathlib import Path

import kmock
import pytest

from shardbench.suite.backends import ClusterOptions, get_backend
from shardbench.suite.backends.kube.rayjob import KubeRayBackend

from .kube_emulator import NAMESPACE, Emulator, install_shims, serve_log, write_kubeconfig
from .test_kube_backend import launcher_log, requests, spec

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
    faulty = replace(ray_spec(), fault="kill-rank:1@3")
    attempt.spec = faulty
    assert "local ray backend only" in attempt.precheck(attempt.values())["error"]


def test_ray_cluster_option_picks_the_rayjob_backend():
    assert type(get_backend("ray", ClusterOptions(), ray_cluster=True)).__name__ == "KubeRayBackend"
    assert type(get_backend("ray")).__name__ == "RayBackend"
