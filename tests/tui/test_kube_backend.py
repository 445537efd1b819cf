"""The cluster backend against the kmock Kubernetes emulator (not a real API server) and real helm.

helm 3 and helm 4 (.tools/helm{3,4}/helm, `make tools`) each install the real chart/ into the
emulator (helm 4 with server-side apply); the test then
plays the MPI Operator (launcher pod, job conditions, pod log) through the emulator's API, and the
backend must watch the MPIJob, stream the launcher log, collect the record and uninstall the
release. See tests/tui/kube_emulator.py for what the emulator does and does not do.
"""
from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from trainer.record import END_MARKER, PROGRESS_PREFIX, START_MARKER
from tui.suite.backends.kube import KubeBackend, job_phase, release_name, release_values
from tui.suite.events import RunLogLine, RunProgress, RunStateChanged
from tui.suite.matrix import RunSpec

from .conftest import synthetic_record
from .kube_emulator import (NAMESPACE, Emulator, add_event, add_pod, install_shims, mpijobs, serve_log,
                            set_conditions, wait_for_mpijob, write_kubeconfig)

REPO = Path(__file__).resolve().parents[2]
HELMS = {"helm3": REPO / ".tools" / "helm3" / "helm", "helm4": REPO / ".tools" / "helm4" / "helm"}


@pytest.fixture(params=sorted(HELMS))
def helm(request) -> Path:
    # A missing helm is a broken set-up, not a reason to prove nothing: fail, don't skip.
    path = HELMS[request.param]
    assert path.exists(), f"{request.param} not installed: run `make tools` (make test does)"
    return path


def spec(run_id: str = "ddp-w2-s64-mb4-ga1-r0") -> RunSpec:
    return RunSpec(run_id=run_id, strategy="ddp", world_size=2, seq_len=64, micro_batch=4,
                   grad_accum=1, model="tiny", precision="fp32", steps=5, warmup_steps=2, repeat=0,
                   launcher="mpirun", backend="kubernetes", shape="cpu", nodes=1, procs_per_node=2,
                   device="cpu", timeout_s=60)


def record_for(s: RunSpec, tokens_per_s: float) -> dict:
    """What the trainer's rank 0 prints at the end of this run (a full record)."""
    record = synthetic_record(s.strategy, s.world_size, tokens_per_s, 0.5)
    record["run_id"] = s.run_id
    return record


def launcher_log(s: RunSpec, tokens_per_s: float) -> list[str]:
    lines = [f"[1,0]<stdout>:{PROGRESS_PREFIX}" + json.dumps(
        {"step": i, "steps": s.steps, "phase": "measure", "loss": 10.0 - i, "tokens_per_s": 1000.0 + i})
        for i in range(1, s.steps + 1)]
    return lines + [START_MARKER, json.dumps(record_for(s, tokens_per_s)), END_MARKER, "launcher done"]


@pytest.fixture
async def cluster(tmp_path, helm):
    async with Emulator() as emu, emu.Server(emu) as server:
        install_shims(emu)
        yield emu, write_kubeconfig(tmp_path / "kubeconfig", str(server.url)), helm


def backend(kubeconfig: Path, helm: Path, **kw) -> KubeBackend:
    return KubeBackend(kubeconfig=str(kubeconfig), helm=str(helm), poll_s=0.2, **kw)


def requests(emu, method: str, needle: str) -> list:
    return [r for r in list(emu) if str(r.method.value).upper() == method and needle in r.url.path]


async def run_in_thread(b: KubeBackend, s: RunSpec, run_dir: Path, cancel=None, timeout_s=60):
    events: list = []
    cancel = cancel or threading.Event()
    record = await asyncio.to_thread(b.run, s, run_dir, events.append, cancel, timeout_s)
    return record, events


async def test_run_installs_watches_streams_collects_and_uninstalls(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        job = await wait_for_mpijob(emu)
        name = job["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        add_pod(emu, name, "worker", "Running")
        pod = add_pod(emu, name, "launcher", "Running")
        serve_log(emu, pod, launcher_log(s, 4321.5))
        await set_conditions(emu, name, "Created", "Running")
        await asyncio.sleep(1.0)
        await set_conditions(emu, name, "Created", "Running", "Succeeded")
        return job

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    job = await op

    # helm created the real chart's MPIJob with this run's values, in the context's namespace.
    assert job["metadata"]["name"] == f"{release_name(s.run_id)}-shardbench"
    assert requests(emu, "POST", f"/namespaces/{NAMESPACE}/mpijobs")
    # helm 4 sends its objects by server-side apply, helm 3 by create.
    applied_job = [p for p in emu.applied if "/mpijobs/" in p]
    assert bool(applied_job) == (helm.parent.name == "helm4"), emu.applied
    assert s.run_id in json.dumps(job["spec"]) and "--strategy" in json.dumps(job["spec"])
    # The MPIJob was watched, the launcher's log followed.
    assert any(r.params.get("watch") == "true" for r in requests(emu, "GET", "/mpijobs"))
    logs = requests(emu, "GET", "/log")
    assert logs and logs[0].params.get("follow") == "true"
    # The record is the one the launcher printed, on disk too.
    assert record["status"] == "ok" and record["tokens_per_s"] == 4321.5
    assert json.loads((tmp_path / "run" / "result.json").read_text())["tokens_per_s"] == 4321.5
    assert "launcher done" in (tmp_path / "run" / "log.txt").read_text()
    states = [e.state for e in events if isinstance(e, RunStateChanged)]
    assert states == ["installing", "running", "collecting"]
    progress = [e for e in events if isinstance(e, RunProgress)]
    assert [p.step for p in progress] == list(range(1, s.steps + 1)) and progress[-1].tokens_per_s == 1005.0
    # Uninstalled: the job, its ConfigMap and helm's release Secret are gone.
    assert requests(emu, "DELETE", "/mpijobs/")
    assert mpijobs(emu) == {}
    live = [(res.plural, name) for (res, ns, name), obj in emu.objects.items() if not obj.deleted]
    assert not [x for x in live if x[0] in ("secrets", "configmaps")], live


async def test_pod_that_cannot_start_shows_events_and_release_is_kept(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec("zero2-w2-s64-mb4-ga1-r0")

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        pod = add_pod(emu, name, "launcher", "Pending", waiting="ImagePullBackOff")
        add_event(emu, pod, "Failed", 'Failed to pull image "shardbench:0.1.0-cpu": not found')

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm, keep_failed=True, start_timeout_s=4), s,
                                         tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "failed" and "ImagePullBackOff" in record["error"]
    lines = [e.line for e in events if isinstance(e, RunLogLine)]
    assert any("[event]" in line and "Failed to pull image" in line for line in lines)
    assert any("kept release" in line for line in lines)
    assert len(mpijobs(emu)) == 1 and not requests(emu, "DELETE", "/mpijobs/")


async def test_cancel_uninstalls_the_release(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()
    cancel = threading.Event()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        pod = add_pod(emu, name, "launcher", "Running")
        serve_log(emu, pod, launcher_log(s, 1.0), delay_s=2.0)  # a slow run
        await set_conditions(emu, name, "Created", "Running")

    def on_event(event):
        if isinstance(event, RunProgress):
            cancel.set()

    op = asyncio.create_task(operator())
    b = backend(kubeconfig, helm, keep_failed=True)  # kept on failure, but a cancel always uninstalls
    events: list = []
    record = await asyncio.to_thread(b.run, s, tmp_path / "run", lambda e: (events.append(e), on_event(e)),
                                     cancel, 60)
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "failed" and "cancelled" in record["error"]
    assert mpijobs(emu) == {} and requests(emu, "DELETE", "/mpijobs/")


async def test_availability_reasons(cluster, tmp_path, monkeypatch):
    emu, kubeconfig, helm = cluster
    assert await asyncio.to_thread(backend(kubeconfig, helm).availability) == (True, "")

    ok, why = KubeBackend(kubeconfig=str(kubeconfig), helm="/nonexistent/helm").availability()
    assert not ok and "helm not found" in why

    monkeypatch.setenv("SHARDBENCH_CHART", str(tmp_path))  # a directory with no Chart.yaml
    ok, why = KubeBackend(kubeconfig=str(kubeconfig), helm=str(helm)).availability()
    assert not ok and why == (f"no chart at {tmp_path}: run from a shardbench checkout or set "
                              "SHARDBENCH_CHART to its chart/ directory")
    monkeypatch.delenv("SHARDBENCH_CHART")

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    ok, why = KubeBackend(helm=str(helm)).availability()
    assert not ok and why.startswith("no kubeconfig")

    dead = write_kubeconfig(tmp_path / "dead", "http://127.0.0.1:9")  # discard port: nothing listens
    ok, why = await asyncio.to_thread(backend(dead, helm).availability)
    assert not ok and "unreachable" in why and "127.0.0.1:9" in why


async def test_cluster_without_mpi_operator_is_unavailable(tmp_path, helm):
    async with Emulator() as emu, emu.Server(emu) as server:
        install_shims(emu, with_mpi_operator=False)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", str(server.url))
        ok, why = await asyncio.to_thread(backend(kubeconfig, helm).availability)
    assert not ok and "MPI Operator not installed" in why


def test_values_merge_shape_file_and_run_overrides(tmp_path):
    (tmp_path / "h100.yaml").write_text("shape: {name: h100, gpusPerNode: 8}\nrun: {extraArgs: [--compile], steps: 100}\n")
    s = RunSpec(run_id="zero3-w16-s2048-mb1-ga4-r0", strategy="zero3", world_size=16, seq_len=2048,
                micro_batch=1, grad_accum=4, model="gpt2-124m", precision="bf16", steps=50,
                warmup_steps=10, repeat=0, launcher="deepspeed", backend="kubernetes", shape="h100",
                nodes=2, procs_per_node=8)
    values = release_values(s, tmp_path)
    assert values["shape"] == {"name": "h100", "gpusPerNode": 8}
    assert values["run"]["steps"] == 50 and values["run"]["extraArgs"] == []  # lists replace, not append
    assert (values["workers"], values["gpusPerWorker"], values["launcher"]) == (2, 8, "deepspeed")
    assert release_name("ZeRO3_w16/..") == "zero3-w16"
    assert job_phase({"status": {"conditions": [{"type": "Running", "status": "True"},
                                                {"type": "Failed", "status": "True"}]}}) == "Failed"


async def test_failed_job_seen_through_the_watch_names_the_operator_reason(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        # The log is served before the pod shows up: the backend may ask for it at once.
        serve_log(emu, f"{name}-launcher", ["Traceback (most recent call last):",
                                            "RuntimeError: NCCL timeout on rank 3"])
        add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await asyncio.sleep(0.3)
        await set_conditions(emu, name, "Created", "Running", "Failed", message="launcher exited with code 1")

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    # The job's Failed condition (only the MPIJob watch knows it) and the log's last error line.
    assert record["status"] == "failed"
    assert "RuntimeError: NCCL timeout on rank 3" in record["error"]
    assert "MPIJob Failed: launcher exited with code 1" in record["error"]
    assert mpijobs(emu) == {}  # not kept: keep_failed was not asked for


async def test_helm_memory_driver_renders_the_release_but_sends_nothing(cluster, tmp_path, monkeypatch):
    """Why the lifecycle tests keep helm's default Secret driver: with HELM_DRIVER=memory the helm
    CLI swaps in a printing fake kube client, so the install 'succeeds' with the run's values
    rendered while the cluster (here the emulator) receives no object at all."""
    emu, kubeconfig, helm = cluster
    empty = tmp_path / "releases.yaml"
    empty.write_text("[]\n")  # helm 3.19 exits when HELM_MEMORY_DRIVER_DATA names no file
    monkeypatch.setenv("HELM_DRIVER", "memory")
    monkeypatch.setenv("HELM_MEMORY_DRIVER_DATA", str(empty))
    s = spec()
    b = backend(kubeconfig, helm)
    resources = await asyncio.to_thread(b.install, s, release_name(s.run_id))
    job = next(r for r in resources if r["kind"] == "MPIJob")
    assert s.run_id in json.dumps(job) and job["metadata"]["name"].startswith(release_name(s.run_id))
    assert not [r for r in list(emu) if str(r.method.value).upper() in ("POST", "PUT", "PATCH")]
    assert mpijobs(emu) == {}
    # Uninstall in another helm process cannot see a memory release: pyhelm3 treats it as gone.
    await asyncio.to_thread(b.helm_call, "uninstall_release", release_name(s.run_id), namespace=NAMESPACE)
