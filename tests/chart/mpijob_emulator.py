"""Plays the MPI Operator, the kubelet and the image for one rendered MPIJob, on this machine.

Run as root inside a private mount + network + UTS namespace (`unshare -m -n -u python
mpijob_emulator.py spec.json`): nothing it mounts or starts is visible outside, and it all goes
away with the namespace. tests/chart/test_emulated_mpijob.py writes spec.json from the chart's
rendered MPIJob. What it lays out, each as the real thing would:

- the image: the non-root user (passwd/group entries, home), the venv at /opt/venv, the sshd and
  ssh client configs the Dockerfile installs, a read-only root filesystem;
- the kubelet: the operator's ssh Secret at sshAuthMountPath and its ConfigMap at /etc/mpi, both in
  the atomic-writer layout (files are symlinks through `..data` to a timestamped directory; root
  owns them, the pod's fsGroup is their group, mode 0644 / 0444, mounted read-only); emptyDirs for
  /tmp and ~/.cache;
- the operator: the hostfile `<job>-worker-<i>.<job>.<ns>.svc slots=N`, the workers' DNS names
  (here /etc/hosts: 127.0.0.2, 127.0.0.3, ...: loopback addresses that are no interface's
  address, so OpenMPI really goes through ssh to reach them), the launcher's environment;
- the pods: one Debian sshd per worker, started as the non-root user with the worker container's
  command and environment, listening on that worker's address; then the launcher container's
  args run through the image's entrypoint, as that user, with the launcher's environment.

It prints the launcher's output and exits with its exit code.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def mount(*argv: str) -> None:
    sh("mount", *argv)


def overlay(target: str, scratch: Path, mode: int = 0o755) -> None:
    """A writable private copy of `target`: changes land in scratch, never on the host."""
    upper, work = scratch / "upper", scratch / "work"
    upper.mkdir(parents=True)
    work.mkdir()
    upper.chmod(mode)  # the merged directory takes the upper one's mode
    mount("-t", "overlay", "overlay", "-o", f"lowerdir={target},upperdir={upper},workdir={work}", target)


def tmpfs(target: str, mode: str = "0755") -> None:
    mount("-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", target)


def read_only(target: str) -> None:
    # A bind remount changes only this namespace's mount, never the filesystem itself.
    mount("-o", "remount,bind,ro", target)


def make_traversable(path: str, scratch: Path) -> None:
    """The non-root user must reach the interpreter (pyenv installs under /root, mode 0700):
    every ancestor it cannot enter gets a private overlay with an enterable mode."""
    for parent in reversed(list(Path(path).parents)):
        if str(parent) != "/" and not os.stat(parent).st_mode & 0o001:
            overlay(str(parent), scratch / f"traverse-{len(list(scratch.glob('traverse-*')))}")


def empty_tmp(keep: list[str]) -> None:
    """The pod's /tmp emptyDir, with the host paths in `keep` that lie under /tmp (a CI clone,
    its venv, the test's scratch) bound back in at the same place: hidden, the launcher could
    not find this checkout's entrypoint or the venv its scripts name."""
    keep = sorted({p for p in keep if Path(p).is_relative_to("/tmp")})
    if keep:
        tmpfs("/mnt")
        Path("/mnt/host-tmp").mkdir()
        mount("--rbind", "/tmp", "/mnt/host-tmp")
    tmpfs("/tmp", "1777")
    for path in keep:
        Path(path).mkdir(parents=True, exist_ok=True)
        mount("--rbind", str(Path("/mnt/host-tmp") / Path(path).relative_to("/tmp")), path)


def atomic_writer_volume(target: str, files: dict[str, str], mode: int, gid: int) -> None:
    """A Secret / ConfigMap volume as the kubelet writes it: a timestamped directory holding the
    files, `..data` pointing at it, and each file name a symlink through `..data`."""
    tmpfs(target)
    stamp = time.strftime("..%Y_%m_%d_%H_%M_%S.000000001")
    data = Path(target) / stamp
    data.mkdir()
    for name, text in files.items():
        (data / name).write_text(text)
        os.chown(data / name, 0, gid)
        (data / name).chmod(mode)
        os.symlink(f"..data/{name}", Path(target) / name)
    os.symlink(stamp, Path(target) / "..data")
    read_only(target)


def lay_out_image(spec: dict, scratch: Path) -> None:
    user, uid, home = spec["user"], spec["uid"], f"/home/{spec['user']}"
    overlay("/etc", scratch / "etc")
    with open("/etc/passwd", "a") as fh:
        fh.write(f"{user}:x:{uid}:{uid}::{home}:/bin/bash\n")
    with open("/etc/group", "a") as fh:
        fh.write(f"{user}:x:{uid}:\n")
    Path("/etc/ssh/ssh_config.d").mkdir(parents=True, exist_ok=True)
    Path("/etc/ssh/ssh_config.d/00-shardbench.conf").write_text(spec["ssh_client_config"])
    # The venv where the Dockerfile puts it; the interpreter reachable by the user.
    tmpfs("/opt")
    Path("/opt/venv").mkdir()
    mount("--bind", spec["venv"], "/opt/venv")
    # Scripts' shebangs name the venv's real path, and the launcher runs this checkout's
    # docker/entrypoint.sh: both must be reachable too (a clone under /root, say).
    for path in (os.path.realpath(spec["python"]), spec["python"], spec["launcher_argv"][0]):
        make_traversable(path, scratch)
    # The image installs this checkout's trainer: shadow whatever copy the venv would import.
    if spec["installed_trainer"] != spec["repo_trainer"]:
        mount("--bind", spec["repo_trainer"], spec["installed_trainer"])
    tmpfs("/home")
    Path(home).mkdir()
    Path(home, ".sshd_config").write_text(spec["sshd_config"])
    for sub in (".ssh", ".cache"):
        Path(home, sub).mkdir()
    os.chown(home, uid, uid)
    os.chown(Path(home, ".sshd_config"), uid, uid)


def lay_out_operator(spec: dict, scratch: Path) -> None:
    uid, home = spec["uid"], f"/home/{spec['user']}"
    key = scratch / "key"
    # The operator's key: ECDSA P-521 in PEM ("EC PRIVATE KEY"), stored under the id_rsa names.
    sh("ssh-keygen", "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", str(key))
    pub = Path(f"{key}.pub").read_text()
    atomic_writer_volume(spec["ssh_auth_mount_path"],
                         {"id_rsa": key.read_text(), "id_rsa.pub": pub, "authorized_keys": pub},
                         mode=0o644, gid=uid)
    Path("/etc/mpi").mkdir()
    atomic_writer_volume("/etc/mpi", {"hostfile": spec["hostfile"]}, mode=0o444, gid=uid)
    for path, files in spec["config_mounts"].items():  # the chart's own ConfigMap
        Path(path).mkdir(parents=True, exist_ok=True)
        atomic_writer_volume(path, files, mode=0o644, gid=uid)
    with open("/etc/hosts", "a") as fh:
        for host, addr in spec["hosts"].items():
            fh.write(f"{addr} {host}\n")
    # emptyDirs (the pods share them here: one machine).
    tmpfs(f"{home}/.cache", "0777")
    empty_tmp(spec["keep_in_tmp"])
    # readOnlyRootFilesystem: everything but the volumes above.
    for target in ("/", "/etc", "/opt", "/opt/venv", "/home"):
        read_only(target)


def bring_up_network(spec: dict) -> None:
    """loopback, and the pod's eth0 (a veth; its address is the launcher's pod IP): OpenMPI's
    daemons call back to mpirun over a non-loopback interface, as they do in a cluster."""
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth0-peer")
    sh("ip", "addr", "add", spec["pod_cidr_addr"], "dev", "eth0")
    sh("ip", "link", "set", "eth0-peer", "up")
    sh("ip", "link", "set", "eth0", "up")


def as_user(spec: dict) -> dict:
    return {"user": spec["uid"], "group": spec["uid"], "extra_groups": []}


def start_workers(spec: dict) -> list[subprocess.Popen]:
    """Each worker's sshd; a worker in spec["late_workers"] ({index: seconds}) starts that late,
    and nobody waits for it: the launcher starts with the workers, as under Kueue when the
    operator's wait-for-workers check passes with 0 of 0 (kubeflow/mpi-operator#868)."""
    procs: list[subprocess.Popen] = []
    late = {int(i): s for i, s in (spec.get("late_workers") or {}).items()}

    def start(addr: str, env: dict) -> None:
        cmd = [*spec["worker_command"], "-o", f"ListenAddress={addr}"]
        procs.append(subprocess.Popen(cmd, env=env, cwd=f"/home/{spec['user']}", **as_user(spec)))

    for i, (addr, env) in enumerate(zip(spec["worker_addrs"], spec["worker_envs"])):
        if i in late:
            timer = threading.Timer(late[i], start, (addr, env))
            timer.daemon = True
            timer.start()
        else:
            start(addr, env)
    for i, addr in enumerate(spec["worker_addrs"]):  # the readinessProbe: sshd accepts connections
        if i in late:
            continue
        deadline = time.time() + 30
        while True:
            try:
                socket.create_connection((addr, spec["ssh_port"]), timeout=1).close()
                break
            except OSError:
                if time.time() > deadline:
                    raise SystemExit(f"emulator: sshd on {addr}:{spec['ssh_port']} never came up")
                time.sleep(0.2)
    return procs


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    scratch = Path(spec["scratch"])
    bring_up_network(spec)
    sh("hostname", spec["launcher_hostname"])
    lay_out_image(spec, scratch)
    lay_out_operator(spec, scratch)
    workers = start_workers(spec)
    try:
        launcher = subprocess.run(spec["launcher_argv"], env=spec["launcher_env"],
                                  cwd=f"/home/{spec['user']}", timeout=spec["timeout_s"],
                                  **as_user(spec))
        return launcher.returncode
    except subprocess.TimeoutExpired:
        # What was still running: the namespace's processes (all of them die with it).
        print(f"emulator: the launcher ran past {spec['timeout_s']} s; processes left:", file=sys.stderr)
        subprocess.run(["ps", "-eo", "pid,ppid,user,stat,etime,args"], stdout=sys.stderr)
        return 124
    finally:
        for proc in list(workers):
            proc.terminate()
        for proc in list(workers):
            proc.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
