"""The Dockerfile cannot be built here (no Docker engine), so check what the chart relies on:
the non-root user and uid, the sshd config and port, the entrypoint, the CPU variant, prebuilt
DeepSpeed ops; and run docker/entrypoint.sh, which needs no image."""
from __future__ import annotations

import os
import shlex
import subprocess

import pytest
import yaml

from chart_helpers import CHART, REPO, launcher_argv, one, render

DEFAULTS = yaml.safe_load((CHART / "values.yaml").read_text())


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in (REPO / "Dockerfile").read_text().splitlines():
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


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
    assert "StrictHostKeyChecking no" in runs() and "/etc/ssh/ssh_config.d/" in runs()


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


def test_variants_and_prebuilt_ops():
    a = args()
    assert a["VARIANT"] == "cuda"
    froms = [rest for word, rest in instructions() if word == "FROM"]
    assert "base-${VARIANT}" in froms
    assert any("cuda" in f and "devel" in f for f in (a["CUDA_IMAGE"],))
    r = runs()
    assert '"$VARIANT" = cpu' in r and "$TORCH_CPU_INDEX" in r
    assert "DS_BUILD_OPS=0" in r and "DS_BUILD_FUSED_ADAM=1" in r and "DS_BUILD_CPU_ADAM=1" in r
    assert set(a["TORCH_CUDA_ARCH_LIST"].split(";")) >= {"8.0", "8.6", "9.0"}  # A100, A10, H100/H200
    assert "--no-build-isolation" in r
    for package in ("openmpi-bin", "openssh-server", "openssh-client"):
        assert package in r
    assert "pip install /src" in r
    # Same pins as the local venv (scripts/bootstrap.sh).
    boot = (REPO / "scripts" / "bootstrap.sh").read_text()
    assert f'torch=={a["TORCH_VERSION"]}' in boot and f'deepspeed=={a["DEEPSPEED_VERSION"]}' in boot


def test_cpu_values_use_the_cpu_variant():
    cpu = yaml.safe_load((REPO / "values" / "cpu.yaml").read_text())
    assert cpu["image"]["tag"].endswith("-cpu")
    assert "--build-arg VARIANT=cpu" in (REPO / "Dockerfile").read_text()


def test_dockerignore_keeps_the_context_small():
    lines = [l for l in (REPO / ".dockerignore").read_text().splitlines() if l and not l.startswith("#")]
    assert lines[0] == "*"
    allowed = {l[1:].rstrip("/") for l in lines if l.startswith("!")}
    copied = {src.rstrip("/") for w, r in instructions() if w == "COPY" and "--from" not in r
              for src in shlex.split(r)[:-1]}
    assert copied <= allowed | {"docker/sshd_config", "docker/entrypoint.sh"}
    assert "docker" in allowed and ".venv" not in allowed


ENTRYPOINT = REPO / "docker" / "entrypoint.sh"


def run_entrypoint(tmp_path, hosts: str, role: str = "launcher", wait: str = "3"):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(hosts)
    env = dict(os.environ, K_MPI_JOB_ROLE=role, SHARDBENCH_HOSTFILE=str(hostfile), SHARDBENCH_DNS_WAIT_S=wait)
    return subprocess.run(["bash", str(ENTRYPOINT), "echo", "launched"], capture_output=True, text=True,
                          env=env, timeout=30)


def test_entrypoint_runs_the_command_once_hosts_resolve(tmp_path):
    proc = run_entrypoint(tmp_path, "# the operator's format\nlocalhost slots=2\n")
    assert proc.returncode == 0 and proc.stdout == "launched\n", proc.stderr


def test_entrypoint_gives_up_on_a_host_that_never_resolves(tmp_path):
    proc = run_entrypoint(tmp_path, "localhost slots=1\nno-such-host.invalid slots=1\n", wait="1")
    assert proc.returncode == 1 and "launched" not in proc.stdout
    assert "no-such-host.invalid (from" in proc.stderr and "did not resolve within 1s" in proc.stderr


@pytest.mark.parametrize("role", ["worker", ""])
def test_entrypoint_does_not_wait_on_workers(tmp_path, role):
    proc = run_entrypoint(tmp_path, "no-such-host.invalid slots=1\n", role=role)
    assert proc.returncode == 0 and proc.stdout == "launched\n"
