"""The cluster path, round 2 (issue 20), against the kmock emulator (not a real API server) and
real helm 3: the image flags reach the pods and a failed pull ends the run at once; every attempt
checkpoints into a fresh directory on a ReadWriteMany volume sized for the model; a volume that
cannot be provisioned, or stays Pending, is the reason a run reports; a replacement worker that
fails after kill-rank ends the run. The test plays the MPI Operator and the kubelet through the
API, as tests/tui/test_kube_backend.py does."""
from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from shardbench.suite.backends import ClusterOptions
from shardbench.suite.backends.kube.backend import WORKERS_READY, WORKERS_WAITING
from shardbench.suite.backends.kube.overrides import ImageChoice, attempt_values, image_choice
from shardbench.suite.cli.commands import main as shardbench

from .kube_emulator import (NAMESPACE, PodLog, add_event, add_pod, mpijobs, set_conditions, set_pod_status,
                            wait_for_mpijob)
from .test_kube_backend import (backend, cluster, helm, launcher_log, log_lines, pod_gone,  # noqa: F401
                                progress_line, run_in_thread, spec)

REPO = Path(__file__).resolve().parents[2]
HELM3 = pytest.mark.parametrize("helm", ["helm3"], indirect=True)  # one helm is enough here
IMAGE = "registry.example.com/team/shardbench:0.2.0-cu126"


def checkpointing(run_id: str = "ddp-w2-s64-mb4-ga1-r0"):
    """Two workers (nodes) that checkpoint on the results volume."""
    return replace(spec(run_id), nodes=2, procs_per_node=1, extra_knobs=(("checkpoint_every", 2),))


def pull_failure(emu, job: str, image: str) -> str:
    """Worker 0 as the kubelet shows a pull that failed (the registry has no such tag)."""
    pod = add_pod(emu, job, "worker", "Pending")
    set_pod_status(emu, pod, {"phase": "Pending", "containerStatuses": [{
        "name": "worker", "image": image, "ready": False,
        "state": {"waiting": {"reason": "ErrImagePull",
                              "message": f'rpc error: failed to pull "{image}": not found'}}}]})
    return pod


def claim(emu, job: str) -> str:
    return f"{job}-results"


def set_claim_status(emu, name: str, status: dict) -> None:
    raw = dict(emu.objects["v1/persistentvolumeclaims", NAMESPACE, name].raw)
    emu.objects["v1/persistentvolumeclaims", NAMESPACE, name] = {**raw, "status": status}


def pvc(emu, name: str) -> dict:
    return emu.objects["v1/persistentvolumeclaims", NAMESPACE, name].raw


async def pending_claim(emu, reason: str, message: str) -> str:
    """The operator makes the job and a worker that waits on the results claim, which stays
    Pending with this event on it (as the provisioner reports it)."""
    name = (await wait_for_mpijob(emu))["metadata"]["name"]
    await set_conditions(emu, name, "Created")
    add_pod(emu, name, "worker", "Pending")
    set_claim_status(emu, claim(emu, name), {"phase": "Pending"})
    add_event(emu, claim(emu, name), reason, message, kind="PersistentVolumeClaim")
    return name


def checkpoint_dir(job: dict) -> str:
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--checkpoint-dir") + 1]


# --- pure ------------------------------------------------------------------------------------

def test_image_flags_parse_and_conflicts_are_one_line():
    assert image_choice(IMAGE, pull_policy="Always") == ImageChoice(
        "registry.example.com/team/shardbench", "0.2.0-cu126", None, "Always")
    digest = "sha256:" + "a" * 64
    assert image_choice(f"host:5000/sb@{digest}").values() == {"image": {"repository": "host:5000/sb", "digest": digest}}
    assert image_choice(repository="reg.io/sb", tag="0.1.0-cuda").values() == {
        "image": {"repository": "reg.io/sb", "tag": "0.1.0-cuda"}}
    assert ImageChoice().values() == {}
    for kwargs, says in (({"image": "Bad Ref!"}, "is not an image reference"),
                         ({"image": IMAGE, "tag": "x"}, "--image already has a tag"),
                         ({"image": "reg.io/sb", "repository": "reg.io/other"}, "both name the repository"),
                         ({"pull_policy": "Sometimes"}, "use one of Always, IfNotPresent, Never")):
        with pytest.raises(ValueError, match=says) as err:
            image_choice(**kwargs)
        assert "\n" not in str(err.value)


def test_bad_image_flag_exits_2_with_one_line(capsys, tmp_path, monkeypatch):
    """At once: the flag was checked only after the whole default matrix was planned (5-16 s)."""
    from shardbench.suite.matrix import planning

    def no_planning(specs):
        raise AssertionError("planned before the flags were checked")
    monkeypatch.setattr(planning, "predict_specs", no_planning)
    code = shardbench(["run", "--backend", "kubernetes", "--results", str(tmp_path / "r"), "--yes",
                       "--image", "Bad Ref!"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("shardbench: --image 'Bad Ref!' is not an image reference")


def test_attempt_values_fresh_checkpoints_rwx_and_the_start_timeout():
    values = {"workers": 2, "persistence": {"enabled": True}, "checkpoint": {"enabled": True}}
    one, two = attempt_values(values, 900, False), attempt_values(values, 900, False)
    assert one["checkpoint"]["attempt"] != two["checkpoint"]["attempt"] and one["checkpoint"]["resume"] is False
    assert one["persistence"] == {"accessModes": ["ReadWriteMany"]} and one["workerWaitSeconds"] == 900
    assert attempt_values(values, 60, True)["checkpoint"]["resume"] is True
    assert "persistence" not in attempt_values({**values, "workers": 1}, 60, False)
    assert attempt_values({"workers": 1}, 30.5, False) == {"workerWaitSeconds": 30}


# --- against the emulated API server ---------------------------------------------------------

@HELM3
async def test_image_flags_reach_the_pods_and_a_failed_pull_ends_the_run_at_once(cluster, tmp_path):
    """Before: ErrImagePull counted as slow, so every run of a matrix waited its whole start
    timeout. Now the run fails at once with the image and the kubelet's reason. The same two
    attempts show each checkpointing into a directory of its own on a ReadWriteMany volume."""
    emu, kubeconfig, helm = cluster
    s = checkpointing()
    options = ClusterOptions(image=IMAGE, image_pull_policy="Always")
    jobs = []

    async def operator():
        while jobs and mpijobs(emu):  # the rerun first uninstalls the kept attempt
            await asyncio.sleep(0.05)
        job = await wait_for_mpijob(emu)
        jobs.append(job)
        await set_conditions(emu, job["metadata"]["name"], "Created")
        pull_failure(emu, job["metadata"]["name"], IMAGE)

    for attempt in range(2):
        op = asyncio.create_task(operator())
        b = backend(kubeconfig, helm, start_timeout_s=30, image=options.image_choice(), keep_failed=attempt == 0,
                    suite="round2")  # one suite: the rerun uninstalls its own kept attempt
        record, _ = await run_in_thread(b, s, tmp_path / f"run{attempt}")
        await op
        assert record["status"] == "failed", record.get("error")  # not "timeout" after 30 s
        assert f"cannot pull image {IMAGE}: ErrImagePull" in record["error"]
        assert "--image" in record["error"] and "not found" in record["error"]
        if attempt == 0:
            volume = pvc(emu, claim(emu, jobs[0]["metadata"]["name"]))
    for job in jobs:
        pods = job["spec"]["mpiReplicaSpecs"]
        for role in ("Launcher", "Worker"):
            container = pods[role]["template"]["spec"]["containers"][0]
            assert (container["image"], container["imagePullPolicy"]) == (IMAGE, "Always")
        env = {e["name"]: e["value"] for e in pods["Launcher"]["template"]["spec"]["containers"][0]["env"]}
        assert env["SHARDBENCH_WORKER_WAIT_S"] == "30"  # the launcher's ssh wait is the start timeout
    # A rerun never resumes the earlier attempt's checkpoints: each has its own directory.
    first, second = (checkpoint_dir(j) for j in jobs)
    assert first != second and "/attempts/" in first and "/attempts/" in second
    assert volume["spec"]["accessModes"] == ["ReadWriteMany"]  # two workers may sit on two nodes
    assert volume["spec"]["resources"]["requests"]["storage"] == "1Gi"  # tiny: 1Gi of records and logs


@HELM3
async def test_resume_checkpoints_keeps_the_runs_directory(cluster, tmp_path):
    emu, kubeconfig, helm = cluster
    s = checkpointing()

    async def operator():
        job = await wait_for_mpijob(emu)
        pull_failure(emu, job["metadata"]["name"], "shardbench:0.1.0-cpu")
        return job

    op = asyncio.create_task(operator())
    await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30, resume_checkpoints=True), s, tmp_path / "run")
    job = await op
    assert checkpoint_dir(job).endswith(f"/{s.run_id}/checkpoints")


@HELM3
async def test_a_claim_that_cannot_be_provisioned_is_the_reason(cluster, tmp_path):
    emu, kubeconfig, helm = cluster

    op = asyncio.create_task(pending_claim(emu, "ProvisioningFailed", 'storageclass.storage.k8s.io "fast-rwx" not found'))
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), checkpointing(), tmp_path / "run")
    await op
    assert record["status"] == "failed", record.get("error")
    assert "results volume claim" in record["error"] and "cannot be provisioned: ProvisioningFailed" in record["error"]
    assert 'storageclass.storage.k8s.io "fast-rwx" not found' in record["error"]


@HELM3
async def test_a_pending_claim_is_named_when_the_start_times_out(cluster, tmp_path):
    """Pods hang in ContainerCreating / Pending behind an unbound claim: the timeout says why."""
    emu, kubeconfig, helm = cluster

    op = asyncio.create_task(pending_claim(emu, "ExternalProvisioning",
                                           "Waiting for a volume to be created by the external provisioner"))
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=2), checkpointing(), tmp_path / "run")
    name = await op
    assert record["status"] == "timeout"
    assert record["error"].startswith(f"timed out: results volume claim {name}-results is Pending (not bound): "
                                      "ExternalProvisioning: Waiting for a volume"), record["error"]
    assert any("is Pending (not bound)" in x for x in log_lines(tmp_path / "run"))


@HELM3
async def test_a_replacement_worker_that_fails_after_kill_rank_ends_the_run(cluster, tmp_path):
    """kill-rank deletes worker 1; the operator's replacement fails (the port still bound on the
    node). It is never recreated, so the run ends with that reason instead of its run timeout."""
    emu, kubeconfig, helm = cluster
    s = replace(checkpointing("ddp-w2-s64-mb4-ga1-kill-r0"), fault="kill-rank:1@3", max_restarts=2)

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created", "Running")
        for i in range(2):
            add_pod(emu, name, "worker", "Running", name=f"{name}-worker-{i}")
        launcher = add_pod(emu, name, "launcher", "Running", name=f"{name}-launcher-first")
        log = PodLog(emu, launcher)
        for i in range(1, 4):
            log.write(progress_line(i, s.steps))
            await asyncio.sleep(0.05)
        for _ in range(200):  # until the backend deleted worker 1
            if pod_gone(emu, f"{name}-worker-1"):
                break
            await asyncio.sleep(0.05)
        replacement = add_pod(emu, name, "worker", "Failed", name=f"{name}-worker-1",
                              terminated={"exitCode": 255, "reason": "Error"})
        PodLog(emu, replacement).write("Bind to port 2222 on 0.0.0.0 failed: Address already in use.")
        return name  # the launcher hangs on: mpirun waits for a daemon that never comes

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run", timeout_s=60)
    name = await op
    assert record["status"] == "failed", record.get("error")  # not the 60 s run timeout
    assert record["error"].startswith(f"replacement worker pod {name}-worker-1 failed after kill-rank:1@3 deleted "
                                      "its predecessor: container worker exited with code 255 (Error)")
    assert "Address already in use" in record["error"] and "does not recreate a failed worker" in record["error"]
    assert mpijobs(emu) == {}  # uninstalled


def test_image_flags_are_cluster_options_of_both_clis():
    from shardbench.tui.app.main import parse_args
    from shardbench.suite.backends import cluster_options, get_backend
    from shardbench.suite.cli.commands import build_parser

    for args in (parse_args(["--image", IMAGE, "--image-pull-policy", "Never", "--resume-checkpoints"]),
                 build_parser().parse_args(["run", "--image", IMAGE, "--image-pull-policy", "Never",
                                            "--resume-checkpoints"])):
        b = get_backend("kubernetes", cluster_options(args))
        assert b.image == ImageChoice("registry.example.com/team/shardbench", "0.2.0-cu126", None, "Never")
        assert b.resume_checkpoints is True
    assert get_backend("kubernetes", cluster_options(parse_args([]))).image == ImageChoice()


@HELM3
async def test_the_run_timeout_starts_once_every_worker_answers_ssh(cluster, tmp_path):
    """Under Kueue the launcher may run while the workers still pull their image: its entrypoint's
    wait (docker/entrypoint.sh, bounded by the start timeout) is start-up, not the run."""
    emu, kubeconfig, helm = cluster
    s = spec()
    waiting = [f"shardbench-entrypoint: waiting for {s.run_id}-shardbench-worker-0 to answer ssh (up to 30s)"]

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created", "Running")
        pod = add_pod(emu, name, "launcher", "Running")
        # 3 s of waiting (longer than the 1.5 s run timeout below), then the run.
        log = PodLog(emu, pod)
        log.write(waiting[0])
        await asyncio.sleep(3.0)
        await log.play([f"{WORKERS_READY} (1 hosts, 3s)", *launcher_log(s, 55.5)], delay_s=0.01)
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=30), s, tmp_path / "run", timeout_s=1.5)
    await op
    assert record["status"] == "ok" and record["tokens_per_s"] == 55.5, record.get("error")


def test_the_entrypoint_prints_what_the_backend_waits_for():
    text = (REPO / "docker" / "entrypoint.sh").read_text()
    assert f'echo "{WORKERS_READY} (' in text and f'echo "{WORKERS_WAITING}$host to answer ssh' in text
