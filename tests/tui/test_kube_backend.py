"""The cluster backend against the kmock Kubernetes emulator (not a real API server) and real helm.

helm 3 and helm 4 (.tools/helm{3,4}/helm, `make tools`) each install the real chart/ into the
emulator (helm 4 with server-side apply); the test then
plays the MPI Operator (launcher pod, job conditions, pod log) through the emulator's API, and the
backend must watch the MPIJob, stream the launcher log, collect the record and uninstall the
release. No API server can run here: kmock is the only part that is emulated; helm, the chart,
the kubernetes client and the backend are real. See tests/tui/kube_emulator.py for what the
emulator does and does not do.
"""
from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.trainer.record import END_MARKER, PROGRESS_PREFIX, START_MARKER
from shardbench.suite.backends.kube import KubeBackend
from shardbench.suite.backends.kube.diagnosis import job_phase, launcher_finished, pod_failure, pod_waiting
from shardbench.suite.backends.kube.values import release_name, release_values
from shardbench.suite.backends.kube.watch import LogCursor, split_stamp
from shardbench.suite.execute.events import RunLogLine, RunProgress, RunStateChanged
from shardbench.suite.matrix.expand import RunSpec

from .conftest import synthetic_record
from .kube_emulator import (NAMESPACE, Emulator, PodLog, add_event, add_pod, collect_garbage, install_shims,
                            mpijobs, serve_log, set_conditions, set_pod_status, wait_for_mpijob,
                            write_kubeconfig)

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


UNSCHEDULABLE = {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/4 nodes are available: 4 Insufficient cpu"}]}


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
        gc = asyncio.create_task(collect_garbage(emu))
        yield emu, write_kubeconfig(tmp_path / "kubeconfig", str(server.url)), helm
        gc.cancel()


def backend(kubeconfig: Path, helm: Path, **kw) -> KubeBackend:
    return KubeBackend(kubeconfig=str(kubeconfig), helm=str(helm), poll_s=0.2, **kw)


def requests(emu, method: str, needle: str) -> list:
    return [r for r in list(emu) if str(r.method.value).upper() == method and needle in r.url.path]


async def run_in_thread(b: KubeBackend, s: RunSpec, run_dir: Path, cancel=None, timeout_s=60):
    events: list = []
    cancel = cancel or threading.Event()
    record = await asyncio.to_thread(b.run, s, run_dir, events.append, cancel, timeout_s)
    return record, events


def log_lines(run_dir: Path) -> list[str]:
    return (run_dir / "log.txt").read_text().splitlines()


async def test_run_installs_watches_streams_collects_and_uninstalls(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        job = await wait_for_mpijob(emu)
        name = job["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        add_pod(emu, name, "worker", "Running")
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 4321.5)).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")
        return job

    op = asyncio.create_task(operator())
    b = backend(kubeconfig, helm)
    record, events = await run_in_thread(b, s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    job = await op

    # helm created the real chart's MPIJob with this run's values, in the context's namespace.
    assert job["metadata"]["name"] == f"{release_name(s.run_id, b.suite)}-shardbench"
    assert requests(emu, "POST", f"/namespaces/{NAMESPACE}/mpijobs")
    # helm 4 sends its objects by server-side apply, helm 3 by create.
    applied_job = [p for p in emu.applied if "/mpijobs/" in p]
    assert bool(applied_job) == (helm.parent.name == "helm4"), emu.applied
    assert s.run_id in json.dumps(job["spec"]) and "--strategy" in json.dumps(job["spec"])
    # The MPIJob was watched, the launcher's log followed with timestamps (to resume from).
    assert any(r.params.get("watch") == "true" for r in requests(emu, "GET", "/mpijobs"))
    logs = requests(emu, "GET", "/log")
    assert logs and logs[0].params.get("follow") == "true" and logs[0].params.get("timestamps") == "true"
    # The record is the one the launcher printed; the log has every line once, without stamps.
    assert record["status"] == "ok" and record["tokens_per_s"] == 4321.5
    lines = log_lines(tmp_path / "run")
    assert [x for x in lines if x in launcher_log(s, 4321.5)] == launcher_log(s, 4321.5)
    # The backend only returns the record: the runner alone writes result.json (issue 8).
    assert not (tmp_path / "run" / "result.json").exists()
    states = [e.state for e in events if isinstance(e, RunStateChanged)]
    assert states == ["installing", "running", "collecting"]
    progress = [e for e in events if isinstance(e, RunProgress)]
    assert [p.step for p in progress] == list(range(1, s.steps + 1)) and progress[-1].tokens_per_s == 1005.0
    # Uninstalled: the job, its ConfigMap and helm's release Secret are gone.
    assert requests(emu, "DELETE", "/mpijobs/")
    assert mpijobs(emu) == {}
    live = [(res.plural, name) for (res, ns, name), obj in emu.objects.items() if not obj.deleted]
    assert not [x for x in live if x[0] in ("secrets", "configmaps")], live


async def test_dropped_log_stream_is_resumed_without_losing_or_repeating_lines(cluster, tmp_path):
    """A load balancer closes the launcher's log stream during a silent stretch (the emulator
    closes the connection mid-response): the backend reopens it from sinceTime and drops the
    overlap, so the run ends ok with the whole log, each line once."""
    emu, kubeconfig, helm = cluster
    s = spec()
    expected = launcher_log(s, 55.5)
    played: list[PodLog] = []

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created", "Running")
        pod = add_pod(emu, name, "launcher", "Running")
        log = serve_log(emu, pod, expected, delay_s=0.02, drop_at=3, silence_s=1.2)
        played.append(log)
        await log.task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    await op
    assert record["status"] == "ok" and record["tokens_per_s"] == 55.5, record.get("error")
    lines = log_lines(tmp_path / "run")
    assert [x for x in lines if x in expected] == expected  # each launcher line once, in order
    assert any("launcher log stream dropped" in x for x in lines)
    # The stream was reopened from the second of the last line seen, not from the start.
    resumed = [q for q in played[0].requests if q.get("sinceTime")]
    assert resumed and all(q["follow"] == "true" and q["timestamps"] == "true" for q in resumed)


def progress_line(step: int, steps: int) -> str:
    return f"[1,0]<stdout>:{PROGRESS_PREFIX}" + json.dumps(
        {"step": step, "steps": steps, "phase": "measure", "loss": 10.0 - step, "tokens_per_s": 1000.0 + step})


def pod_gone(emu, name: str) -> bool:
    return not any(res.plural == "pods" and key == name and not obj.deleted
                   for (res, ns, key), obj in emu.objects.items())


async def test_kill_rank_deletes_its_worker_pod_and_follows_the_retried_launcher(cluster, tmp_path):
    """kill-rank:1@3 on 2 workers x 1 rank: at step 3 the backend deletes worker pod 1 through the
    API. The API server is emulated (kmock) and the test plays the MPI Operator: once the worker
    pod is gone, the first launcher pod fails, the launcher Job starts a second launcher pod
    (backoffLimit = max_restarts), which resumes after the step-2 checkpoint and prints the
    record. The backend follows both pods' logs into one log and returns one record with the
    fault fields the local fault wrapper fills."""
    emu, kubeconfig, helm = cluster
    s = replace(spec("ddp-w2-s64-mb4-ga1-kill-r0"), nodes=2, procs_per_node=1, fault="kill-rank:1@3",
                max_restarts=2, extra_knobs=(("checkpoint_every", 2),))
    final = record_for(s, 777.0)
    final["checkpoint"] = {"resumed_from_step": 2, "restarts": 1}
    retried_lines = [progress_line(i, s.steps) for i in range(3, s.steps + 1)] + [
        START_MARKER, json.dumps(final), END_MARKER, "launcher done"]
    first_lines = [progress_line(i, s.steps) for i in range(1, 4)]

    async def operator():
        job = await wait_for_mpijob(emu)
        name = job["metadata"]["name"]
        await set_conditions(emu, name, "Created", "Running")
        for i in range(2):
            add_pod(emu, name, "worker", "Running", name=f"{name}-worker-{i}")
        first = add_pod(emu, name, "launcher", "Running", name=f"{name}-launcher-first")
        log = PodLog(emu, first)
        for line in first_lines:
            log.write(line)
            await asyncio.sleep(0.05)
        for _ in range(200):  # the backend deletes the worker pod once it has read step 3
            if pod_gone(emu, f"{name}-worker-1"):
                break
            await asyncio.sleep(0.05)
        log.write("ORTE has lost communication with a remote daemon.")
        set_pod_status(emu, first, {"phase": "Failed", "containerStatuses": [
            {"name": "launcher", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]})
        log.end()
        await asyncio.sleep(0.3)
        add_pod(emu, name, "worker", "Running", name=f"{name}-worker-1")  # the operator recreates it
        second = add_pod(emu, name, "launcher", "Running", name=f"{name}-launcher-retry")
        await serve_log(emu, second, retried_lines).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")
        return job

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    job = await op

    # The release checkpoints on the results volume and lets the launcher retry max_restarts times.
    assert job["spec"]["runPolicy"]["backoffLimit"] == 2
    args = json.dumps(job["spec"])
    assert "--checkpoint-dir" in args and '"--checkpoint-every", "2"' in args, args
    # Exactly the pod that holds rank 1 was deleted, once.
    deleted = requests(emu, "DELETE", "/pods/")
    assert [r.url.path.rsplit("/", 1)[1] for r in deleted] == [f"{job['metadata']['name']}-worker-1"]
    # One record for both launches: the retried launcher's, with the fault's recovery.
    assert record["status"] == "ok" and record["tokens_per_s"] == 777.0, record.get("error")
    fault = record["fault"]
    assert fault["fault"] == "kill-rank:1@3" and fault["attempts"] == 2 and fault["injected_at_step"] == 3
    assert fault["steps_redone"] == 1  # step 3 ran again after the step-2 checkpoint
    assert fault["detection_s"] >= 0 and fault["restart_s"] >= 0 and fault["goodput_tokens_per_s"] > 0
    # log.txt holds both launchers' lines, each once, the first launcher's first.
    lines = log_lines(tmp_path / "run")
    expected = first_lines + retried_lines
    assert [x for x in lines if x in expected] == expected
    assert any("deleted worker pod" in x for x in lines)
    states = [e.state for e in events if isinstance(e, RunStateChanged)]
    assert states == ["installing", "running", "running", "collecting"]
    assert [p.step for p in events if isinstance(p, RunProgress)] == [1, 2, 3, 3, 4, 5]


def test_log_cursor_resumes_from_the_last_second_and_drops_the_overlap():
    cursor = LogCursor()
    first = ["2026-01-01T10:00:00.5Z a", "2026-01-01T10:00:01.1Z b", "2026-01-01T10:00:01.2Z b"]
    assert [cursor.accept(x) for x in first] == ["a", "b", "b"]
    assert cursor.since_time() == "2026-01-01T10:00:01Z"
    cursor.resume()  # the server resends that whole second, then goes on
    again = ["2026-01-01T10:00:01.1Z b", "2026-01-01T10:00:01.2Z b", "2026-01-01T10:00:01.7Z c"]
    assert [cursor.accept(x) for x in again] == [None, None, "c"]
    cursor.resume()  # a server that ignores sinceTime resends the whole log
    assert [cursor.accept(x) for x in first + again[2:]] == [None] * 4
    assert cursor.accept("2026-01-01T10:00:02Z d") == "d"
    assert split_stamp("2026-01-01T10:00:02.000000001+01:00 x y") == ((1767258002, 1), "x y")
    assert split_stamp("no stamp") == (None, "no stamp")


def test_pod_states_split_into_fatal_now_and_waiting_within_the_start_timeout():
    def pod(phase="Pending", state=None, conditions=()):
        return {"status": {"phase": phase, "conditions": list(conditions),
                           "containerStatuses": [{"name": "worker", "state": state}] if state else []}}

    crash = pod(state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 20s"}})
    assert pod_failure(crash) == "container worker CrashLoopBackOff: back-off 20s" and pod_waiting(crash) is None
    # A wrong image ends the run at once (issue 20); a pull the kubelet may still win waits
    # (issue 34: tests/tui/test_kube_pull_errors.py).
    for reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName"):
        pull = pod(state={"waiting": {"reason": reason, "message": "pulling: manifest unknown"}})
        assert pod_failure(pull).startswith(f"container worker cannot pull image ?: {reason}")
    unschedulable = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                     "message": "0/4 nodes have nvidia.com/gpu"}])
    assert pod_failure(unschedulable) is None and pod_waiting(unschedulable).startswith("Unschedulable: 0/4")
    exited = pod("Running", {"terminated": {"exitCode": 0}})
    assert pod_failure(exited) is None and launcher_finished(exited)
    assert pod_failure(pod("Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled"}})) == \
        "container worker exited with code 137 (OOMKilled)"
    assert pod_failure({"status": {"phase": "Failed", "reason": "Evicted", "message": "low on memory"}}) == \
        "pod Evicted: low on memory"


async def test_worker_crash_before_the_launcher_is_explained_at_once(cluster, tmp_path):
    """A worker's sshd exits (restartPolicy Never: the pod fails, the launcher is never created):
    the run fails with the pod, exit code and the container's last words, not a start timeout."""
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "worker", "Failed", terminated={"exitCode": 255, "reason": "Error"})
        log = PodLog(emu, pod)
        log.write("sshd: /home/shardbench/.ssh/authorized_keys: bad ownership or modes")
        log.end()

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=60), s, tmp_path / "run")
    await op
    assert record["status"] == "failed"
    assert "worker pod" in record["error"] and "-worker-0 failed" in record["error"]
    assert "exited with code 255 (Error)" in record["error"]
    assert "authorized_keys: bad ownership" in record["error"]
    assert mpijobs(emu) == {}  # uninstalled: keep_failed was not asked for


@pytest.mark.parametrize("refused", ["worker", "launcher"])
async def test_pod_security_rejection_is_explained_at_once(cluster, tmp_path, refused):
    """The API server refuses the pods (Pod Security admission): they never exist. The operator
    says so in an event on the MPIJob (workers), the Job controller on the launcher Job."""
    emu, kubeconfig, helm = cluster
    s = spec()
    why = ('pods "{pod}" is forbidden: violates PodSecurity "baseline:latest": host namespaces '
           '(hostNetwork=true)')

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        if refused == "worker":
            add_event(emu, name, "MPIJobFailed", "worker pod created failed: " + why.format(pod=f"{name}-worker-0"),
                      kind="MPIJob")
        else:
            add_pod(emu, name, "worker", "Running")
            add_event(emu, f"{name}-launcher", "FailedCreate",
                      "Error creating: " + why.format(pod=f"{name}-launcher-x7k2p"), kind="Job")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=60), s, tmp_path / "run")
    await op
    assert record["status"] == "failed"
    assert "refused by the cluster" in record["error"]
    assert 'is forbidden: violates PodSecurity "baseline:latest"' in record["error"]


async def test_mpijob_without_status_names_the_missing_operator(cluster, tmp_path):
    """The CRD is served but no operator runs: the MPIJob never gets a status."""
    emu, kubeconfig, helm = cluster
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=60, no_status_s=1.0), spec(),
                                    tmp_path / "run")
    assert record["status"] == "failed"
    assert "has no status 1 s after install" in record["error"] and "MPI Operator is not running" in record["error"]
    assert len(requests(emu, "POST", "/mpijobs")) == 1


async def test_api_errors_while_waiting_for_the_launcher_are_retried(cluster, tmp_path):
    """An API server that answers 500 for a moment (a control-plane upgrade) does not end a run."""
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        # The next two pod listings fail. A slice counts every listing since the start (the
        # pre-install check is one), so it starts after those already served.
        served = len(list(emu["list v1/pods"]))
        (emu ** 1)["list v1/pods"][served:served + 2] << 500
        await asyncio.sleep(0.5)
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 7.5), delay_s=0.01).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "ok" and record["tokens_per_s"] == 7.5, record.get("error")
    assert any("reading the job's pods failed" in x for x in log_lines(tmp_path / "run"))


@pytest.mark.slow  # waits out timeouts / two attempts by design
async def test_start_timeout_is_separate_from_the_run_timeout(cluster, tmp_path):
    """A launcher that takes longer to start (image pull on a cold node) than the whole run
    timeout still runs: the run timeout counts from the launcher's start."""
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "launcher", "Pending")
        set_pod_status(emu, pod, UNSCHEDULABLE)  # a cluster scaling up: time fixes it
        await asyncio.sleep(2.5)  # longer than the 1.5 s run timeout below
        add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 9.5), delay_s=0.01).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), s, tmp_path / "run",
                                    timeout_s=1.5)
    await op
    assert record["status"] == "ok" and record["tokens_per_s"] == 9.5, record.get("error")
    assert any("is waiting: Unschedulable: 0/4 nodes" in x for x in log_lines(tmp_path / "run"))


@pytest.mark.slow  # waits out timeouts / two attempts by design
async def test_launcher_that_never_starts_times_out_naming_both_timeouts(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec("zero2-w2-s64-mb4-ga1-r0")

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        pod = add_pod(emu, name, "launcher", "Pending")
        set_pod_status(emu, pod, UNSCHEDULABLE)
        add_event(emu, pod, "FailedScheduling", "0/4 nodes are available: 4 Insufficient cpu")

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm, keep_failed=True, start_timeout_s=1.5), s,
                                         tmp_path / "run", timeout_s=600)
    await op
    assert record["status"] == "timeout"
    assert "not running 1.5 s after install (start timeout" in record["error"]
    assert "the 600 s run timeout had not started" in record["error"] and "Unschedulable" in record["error"]
    lines = [e.line for e in events if isinstance(e, RunLogLine)]
    assert any("[event]" in line and "Insufficient cpu" in line for line in lines)
    assert any("kept release" in line for line in lines)
    assert len(mpijobs(emu)) == 1 and not requests(emu, "DELETE", "/mpijobs/")


async def test_run_timeout_counts_from_the_launcher_start_and_says_so(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        serve_log(emu, pod, launcher_log(s, 1.0), delay_s=1.0)  # slower than the timeout

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), s, tmp_path / "run",
                                    timeout_s=1.0)
    await op
    assert record["status"] == "timeout"
    assert "longer than the 1 s run timeout (counted from the launcher's start" in record["error"]
    assert "start timeout 30 s" in record["error"]
    assert mpijobs(emu) == {}


@pytest.mark.slow  # waits out timeouts / two attempts by design
async def test_rerun_of_a_kept_failed_run_never_reads_the_old_attempt(cluster, tmp_path):
    """keep_failed leaves attempt 1's MPIJob and launcher pod (same names as attempt 2's) in
    place; the rerun uninstalls them and waits until they are gone, then reads only its own log."""
    emu, kubeconfig, helm = cluster
    s = spec()
    b = backend(kubeconfig, helm, keep_failed=True)

    async def attempt(lines: list[str], exit_code: int):
        job = await wait_for_mpijob(emu)
        name = job["metadata"]["name"]
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, lines, exit_code=exit_code).task
        await set_conditions(emu, name, "Created", "Running", "Failed" if exit_code else "Succeeded")

    op = asyncio.create_task(attempt(["Traceback (most recent call last):", "RuntimeError: attempt one"], 1))
    first, _ = await run_in_thread(b, s, tmp_path / "run")
    await op
    assert first["status"] == "failed" and "attempt one" in first["error"]
    assert len(mpijobs(emu)) == 1  # kept

    async def second():
        while mpijobs(emu):  # the rerun removes the kept attempt first ...
            await asyncio.sleep(0.05)
        await attempt(launcher_log(s, 2222.0), 0)  # ... then installs its own

    op = asyncio.create_task(second())
    record, _ = await run_in_thread(b, s, tmp_path / "run")
    assert op.done() or not op.cancel(), f"the rerun returned without installing anew: {record.get('error')}"
    assert record["status"] == "ok" and record["tokens_per_s"] == 2222.0, record.get("error")
    text = (tmp_path / "run" / "log.txt").read_text()
    assert "attempt one" not in text and "an earlier attempt of" in text


async def test_cancel_returns_a_cancelled_record_and_uninstalls_at_once(cluster, tmp_path):
    """Cancelled while the launcher is silent (a long init): the backend closes the log stream it
    is blocked on instead of waiting for the launcher's next line."""
    emu, kubeconfig, helm = cluster
    s = spec()
    cancel = threading.Event()
    played: list[PodLog] = []

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        played.append(serve_log(emu, pod, launcher_log(s, 1.0), delay_s=30.0))  # silent after line 1

    def on_event(event):
        if isinstance(event, RunProgress):
            cancel.set()

    op = asyncio.create_task(operator())
    b = backend(kubeconfig, helm, keep_failed=True)  # kept on failure, but a cancel always uninstalls
    events: list = []
    record = await asyncio.to_thread(b.run, s, tmp_path / "run", lambda e: (events.append(e), on_event(e)),
                                     cancel, 600)
    await op
    lines_written = len(played[0].lines)
    played[0].task.cancel()
    assert record["status"] == "cancelled" and "cancelled" in record["error"]
    assert lines_written == 1  # it returned before the launcher's next line, 30 s later
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


def test_start_timeout_is_a_cluster_option_of_both_clis():
    from shardbench.tui.app.main import parse_args
    from shardbench.suite.backends import cluster_options, get_backend

    b = get_backend("kubernetes", cluster_options(parse_args(["--start-timeout-s", "1800"])))
    assert b.start_timeout_s == 1800.0
    assert get_backend("kubernetes", cluster_options(parse_args([]))).start_timeout_s == 900.0


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


def test_values_of_a_faulty_run_checkpoint_on_the_volume_and_retry_the_launcher():
    plain = release_values(spec())
    assert "checkpoint" not in plain and "runPolicy" not in plain and "persistence" not in plain
    faulty = release_values(replace(spec(), fault="kill-rank:1@3", max_restarts=3,
                                    extra_knobs=(("checkpoint_every", 2), ("grad_clip", 0.5))))
    assert faulty["checkpoint"] == {"enabled": True, "every": 2} and faulty["persistence"]["enabled"]
    assert faulty["runPolicy"]["backoffLimit"] == 3
    # The chart passes --checkpoint-every with the volume's --checkpoint-dir; extraArgs does not repeat it.
    assert "--checkpoint-every" not in faulty["run"]["extraArgs"] and "--grad-clip" in faulty["run"]["extraArgs"]
    # checkpoint_every alone checkpoints on the volume too, without retrying a failed launcher.
    saving = release_values(replace(spec(), extra_knobs=(("checkpoint_every", 4),)))
    assert saving["checkpoint"] == {"enabled": True, "every": 4} and "runPolicy" not in saving


async def test_failed_job_seen_through_the_watch_names_the_operator_reason(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        # The log is served before the pod shows up: the backend may ask for it at once.
        log = serve_log(emu, f"{name}-launcher", ["Traceback (most recent call last):",
                                                  "RuntimeError: NCCL timeout on rank 3"], exit_code=1)
        add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await log.task
        await set_conditions(emu, name, "Created", "Running", "Failed", message="launcher exited with code 1")

    op = asyncio.create_task(operator())
    record, events = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    await op
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
    client = b.helm_client()
    resources = await asyncio.to_thread(client.install, b.chart, release_name(s.run_id), release_values(s),
                                        NAMESPACE)
    job = next(r for r in resources if r["kind"] == "MPIJob")
    assert s.run_id in json.dumps(job) and job["metadata"]["name"].startswith(release_name(s.run_id))
    assert not [r for r in list(emu) if str(r.method.value).upper() in ("POST", "PUT", "PATCH")]
    assert mpijobs(emu) == {}
    # Uninstall in another helm process cannot see a memory release: pyhelm3 treats it as gone.
    await asyncio.to_thread(client.uninstall, release_name(s.run_id), NAMESPACE)
