"""The chart's MPIJob, run for real on this machine: mpijob_emulator.py plays the MPI Operator, the
kubelet and the image inside a private mount + network namespace (no Kubernetes API server or
container runtime can run here; everything else is real: the rendered launcher args through
docker/entrypoint.sh, Debian's sshd as the non-root user, OpenMPI over ssh to two "worker pods"
on their own loopback addresses, the DeepSpeed launcher, the trainer).

Needs root, a kernel that allows namespaces, and /usr/sbin/sshd (scripts/install-tools.sh
installs openssh-server). Only forbidden namespaces skip; a missing sshd fails.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chart_helpers import REPO, dockerfile_env, one, render

from shardbench.suite.execute.startup import StampClock

pytestmark = pytest.mark.slow

EMULATOR = Path(__file__).with_name("mpijob_emulator.py")
SSHD = "/usr/sbin/sshd"
UNSHARE = ("unshare", "--mount", "--net", "--uts", "--pid", "--fork", "--kill-child", "--mount-proc")
WORKERS = 2
# Probe values: they must reach every rank whatever the launcher. "^docker,lo" is NCCL's own
# exclusion syntax, which DeepSpeed's runner would mangle if it forwarded it (it quotes it).
PROBE_NCCL = {"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_DEBUG": "WARN"}
PROBE_ENV = {"SHARDBENCH_PROBE": "from-values", "OMP_NUM_THREADS": "1"}


def _namespaces_allowed() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mount namespaces, sshd as another user)"
    proc = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
    if proc.returncode != 0:
        return f"the kernel forbids mount/network/UTS namespaces here: {proc.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def emulation_ready():
    reason = _namespaces_allowed()
    if reason:
        pytest.skip(reason)
    if not os.access(SSHD, os.X_OK):
        pytest.fail(f"{SSHD} is missing: run `make tools` (scripts/install-tools.sh installs openssh-server)",
                    pytrace=False)


def _sets(launcher: str, numa_bind: bool) -> tuple[str, ...]:
    sets = [f"launcher={launcher}", f"workers={WORKERS}", "gpusPerWorker=1", f"numaBind={str(numa_bind).lower()}",
            "run.steps=4", "run.warmupSteps=1", "run.strategy=ddp"]
    sets += [f"nccl.{k}={v}".replace(",", "\\,") for k, v in PROBE_NCCL.items()]
    sets += [f"env.{k}={v}".replace(",", "\\,") for k, v in PROBE_ENV.items()]
    return tuple(sets)


def _container_env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", [])}


def _installed_trainer() -> str:
    """Where the venv's own interpreter, with no PYTHONPATH, imports `trainer` from."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", "import shardbench.trainer as t, os; print(os.path.realpath(os.path.dirname(t.__file__)))"],
                         env=env, cwd="/", capture_output=True, text=True, check=True)
    return out.stdout.strip()


def config_mounts(pod: dict, configmap: dict) -> dict[str, dict[str, str]]:
    """mountPath -> files of every volume of `pod` that is the chart's ConfigMap."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in pod["containers"][0]["volumeMounts"]:
        source = volumes[mount["name"]].get("configMap")
        if source and source["name"] == configmap["metadata"]["name"]:
            out[mount["mountPath"]] = configmap["data"]
    return out


def emulation_spec(job: dict, scratch: Path, launcher_args: list[str], configmap: dict) -> dict:
    """What mpijob_emulator.py lays out, from the rendered MPIJob and the image's files."""
    name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
    slots = job["spec"]["slotsPerWorker"]
    replicas = job["spec"]["mpiReplicaSpecs"]
    launcher = replicas["Launcher"]["template"]["spec"]["containers"][0]
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]
    user_uid = replicas["Worker"]["template"]["spec"]["securityContext"]["runAsUser"]
    home = job["spec"]["sshAuthMountPath"].rsplit("/", 1)[0]
    user = home.rsplit("/", 1)[1]
    port = int(worker["command"][worker["command"].index("-p") + 1])
    hosts = {f"{name}-worker-{i}.{name}.{ns}.svc": f"127.0.0.{2 + i}" for i in range(WORKERS)}
    # What a container gets besides its env: the image's ENV, HOME of its user, its HOSTNAME.
    image_env = {**dockerfile_env(), "HOME": home}
    operator_launcher = {
        "K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": str(slots),
        "NVIDIA_VISIBLE_DEVICES": "", "NVIDIA_DRIVER_CAPABILITIES": "",
    }
    launcher_env = {**image_env, "HOSTNAME": f"{name}-launcher", **_container_env(launcher), **operator_launcher}
    worker_envs = [{**image_env, "HOSTNAME": f"{name}-worker-{i}", **_container_env(worker), "K_MPI_JOB_ROLE": "worker"}
                   for i in range(WORKERS)]
    sshd_config = (REPO / "docker" / "sshd_config").read_text() + f"Port {port}\nHostKey {home}/.ssh/id_rsa\n"
    return {
        "scratch": str(scratch), "user": user, "uid": user_uid, "ssh_port": port,
        "venv": sys.prefix, "python": sys.executable,
        "installed_trainer": _installed_trainer(), "repo_trainer": str(REPO / "trainer"),
        "ssh_auth_mount_path": job["spec"]["sshAuthMountPath"],
        "ssh_client_config": (REPO / "docker" / "ssh_config").read_text() + f"    Port {port}\n",
        "sshd_config": sshd_config,
        "hostfile": "".join(f"{h} slots={slots}\n" for h in hosts),
        "hosts": hosts, "worker_addrs": list(hosts.values()),
        "worker_command": worker["command"], "worker_envs": worker_envs,
        "launcher_hostname": f"{name}-launcher", "pod_cidr_addr": "10.244.0.10/24",
        "launcher_env": launcher_env,
        "launcher_argv": [str(REPO / "docker" / "entrypoint.sh"), *launcher_args],
        # The pod's /tmp is an emptyDir: these host paths stay visible through it (a CI clone,
        # its venv or pytest's scratch may all live under /tmp).
        "keep_in_tmp": [str(REPO), os.path.realpath(sys.prefix), str(scratch)],
        "timeout_s": 150,
        # Launcher and workers share one filesystem here: the union of what they mount.
        "config_mounts": {**config_mounts(replicas["Launcher"]["template"]["spec"], configmap),
                          **config_mounts(replicas["Worker"]["template"]["spec"], configmap)},
    }


def run_emulated(tmp_path: Path, launcher: str, probe: bool = False, extra_sets: tuple[str, ...] = (),
                 late_workers: dict[int, float] | None = None) -> tuple[subprocess.CompletedProcess, dict]:
    # The benchmark runs as the GPU shapes launch (ranks NUMA-bound), the probe as the CPU default.
    docs = render("helm3", ("cpu.yaml",), _sets(launcher, numa_bind=not probe) + extra_sets)
    job = one(docs, "MPIJob")
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    if probe:
        args = swap_trainer_for_env(args)
    scratch = tmp_path / "ns"
    scratch.mkdir()
    spec = emulation_spec(job, scratch, args, one(docs, "ConfigMap"))
    if probe:
        spec["timeout_s"] = 40  # /usr/bin/env on each rank takes a few seconds at most
    if late_workers:
        spec["late_workers"] = late_workers
        spec["timeout_s"] += max(late_workers.values())
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    # A PID namespace too: whatever the run leaves behind dies with the emulator.
    proc = subprocess.run([*UNSHARE, sys.executable, str(EMULATOR), str(spec_path)],
                          capture_output=True, text=True, timeout=spec["timeout_s"] + 60)
    return proc, spec


def swap_trainer_for_env(args: list[str]) -> list[str]:
    """The rendered launch command with the trainer replaced by /usr/bin/env on every rank."""
    if args[0] == "mpirun":
        return args[: args.index("python")] + ["/usr/bin/env"]
    return args[: args.index("--module")] + ["--no_python", "/usr/bin/env"]


def record(stdout: str) -> dict:
    lines = stdout.splitlines()
    start = lines.index("BENCHMARK_RESULT_JSON_START")
    return json.loads(lines[start + 1])


@pytest.mark.parametrize("launcher", ["mpirun", "deepspeed"])
def test_emulated_mpijob_runs_across_two_workers(emulation_ready, tmp_path, launcher):
    proc, _ = run_emulated(tmp_path, launcher)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    rec = record(proc.stdout)
    assert rec["status"] == "ok", rec.get("error")
    assert (rec["world_size"], rec["nodes"], rec["launcher"]) == (WORKERS, WORKERS, launcher)
    assert rec["nccl_env"] == PROBE_NCCL  # the shape's NCCL settings reached the ranks
    assert rec["nccl_env_disagreement"] == []  # ... every one of them
    assert rec["versions"]["image"] == "shardbench:0.1.0-cpu"  # SHARDBENCH_IMAGE reached rank 0
    # launcher_startup_s on a cluster: the entrypoint's stamp as it execs the launch command and
    # every rank's own start stamp (through mpirun) are in the launcher's output (suite/execute/startup.py).
    clock = StampClock(WORKERS)
    for line in (proc.stdout + proc.stderr).splitlines():
        clock.feed(line)
    assert clock.launcher is not None and sorted(clock.ranks) == list(range(WORKERS)), proc.stderr[-3000:]
    assert clock.seconds() is not None and clock.seconds() > 0


@pytest.mark.parametrize("launcher", ["mpirun", "deepspeed"])
def test_every_rank_sees_the_rendered_env(emulation_ready, tmp_path, launcher):
    proc, spec = run_emulated(tmp_path, launcher, probe=True)
    lines = proc.stdout.splitlines()
    # OpenMPI 5.0's mpirun now and then (about 1 in 15 here, either launcher) hangs in its
    # teardown when every rank exits at once, after all output is in: a timeout counts only then.
    finished = sum(l.startswith("OMPI_COMM_WORLD_RANK=") for l in lines) == WORKERS
    assert proc.returncode == 0 or (proc.returncode == 124 and finished), proc.stdout[-4000:] + proc.stderr[-4000:]
    ranks = sorted(l for l in lines if l.startswith("OMPI_COMM_WORLD_RANK="))
    assert ranks == [f"OMPI_COMM_WORLD_RANK={r}" for r in range(WORKERS)], proc.stdout
    assert lines.count("OMPI_COMM_WORLD_LOCAL_SIZE=1") == WORKERS  # one rank per "node"
    launcher_env = spec["launcher_env"]
    wanted = {**PROBE_NCCL, **PROBE_ENV, "MASTER_ADDR": launcher_env["MASTER_ADDR"]}
    for name in ("PATH", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "PYTHONWARNINGS"):
        wanted[name] = launcher_env[name]
    missing = {k: v for k, v in wanted.items() if lines.count(f"{k}={v}") != WORKERS}
    assert not missing, f"not on every rank: {missing}\n{proc.stdout}"


# Longer than ssh's own patience (the operator's `-o ConnectionAttempts=10`, about 10 s), so a
# launcher that did not wait would fail its first ssh.
LATE_S = 8


def test_launcher_waits_for_a_late_worker(emulation_ready, tmp_path):
    """Kueue (kubeflow/mpi-operator#868): the launcher starts while worker 1's sshd is not up yet.
    The entrypoint waits until every worker answers ssh, then the run goes through."""
    proc, spec = run_emulated(tmp_path, "mpirun", probe=True, late_workers={1: LATE_S},
                              extra_sets=("workerWaitSeconds=90",))
    assert spec["launcher_env"]["SHARDBENCH_WORKER_WAIT_S"] == "90"  # rendered, reaches the entrypoint
    lines = proc.stdout.splitlines()
    finished = sum(l.startswith("OMPI_COMM_WORLD_RANK=") for l in lines) == WORKERS
    assert proc.returncode == 0 or (proc.returncode == 124 and finished), proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(l for l in lines if l.startswith("OMPI_COMM_WORLD_RANK=")) == [
        f"OMPI_COMM_WORLD_RANK={r}" for r in range(WORKERS)], proc.stdout + proc.stderr[-3000:]
    worker1 = list(spec["hosts"])[1]
    assert f"shardbench-entrypoint: waiting for {worker1} to answer ssh (up to 90s)" in proc.stderr
    assert "shardbench-entrypoint: every worker answers ssh (2 hosts" in proc.stderr
