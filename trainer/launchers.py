"""Launcher command lines: the one source of truth for how a run is started.

The local backend (suite/backends/local.py) runs these argv lists; the Helm chart renders the
same commands in its launcher pod, and tests/chart checks that the two agree flag for flag.
Pure Python with no torch import, so the TUI and the chart tests can use it cheaply.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

LAUNCHERS = ("mpirun", "deepspeed", "torchrun", "ray")

# Variables mpirun forwards to every rank (-x NAME) besides the NCCL_* ones of the environment.
RUN_ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "PYTHONWARNINGS")

# What a rank started over ssh (an MPIJob's workers) would otherwise not have: sshd gives it a
# login environment, not the container's ENV, so where programs, libraries and the writable
# caches are, and the image the record names, must travel from the launcher. The chart forwards
# these besides its nccl:/env: values (the image's ENV or the chart sets every one of them); a
# local run's ranks inherit them anyway.
CONTAINER_ENV_VARS = ("PATH", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "SHARDBENCH_IMAGE")

# Running MPI as root (containers, CI) needs --allow-run-as-root; --oversubscribe lets a CPU run
# place more ranks than cores.
MPIRUN_BASE_FLAGS = ("--allow-run-as-root", "--oversubscribe")
# Where ranks may run. Unbound by default: OpenMPI would otherwise pin every rank to one core.
# NUMA-bound (GPU shapes): each rank bound to a NUMA domain, local ranks filling the domains in
# order (ranks 0-3 on domain 0, 4-7 on domain 1 for 8 GPUs on 2 domains), as GPUs 0-3 hang off
# socket 0; with NCCL_IGNORE_CPU_AFFINITY=1 in the shape's values so NCCL's own threads still
# follow each GPU's affinity. OCI's `-npernode 8 --bind-to numa` (`--map-by ppr:8:node`) put all
# 8 ranks on socket 0 under OpenMPI 5 (tests/trainer/test_gpu_fidelity.py, synthetic topologies);
# `--map-by numa` spreads them but numbers local ranks round-robin (local rank 1 on domain 1).
UNBOUND_FLAGS = ("--bind-to", "none")


def procs_per_numa(procs_per_node: int, numa_nodes: int) -> int:
    """Ranks per NUMA domain: the node's ranks spread over its domains, the last one short."""
    return -(-procs_per_node // numa_nodes)


def numa_bound_flags(per_numa: int) -> list[str]:
    return ["--map-by", f"ppr:{per_numa}:numa", "--bind-to", "numa"]


@dataclass
class LaunchPlan:
    """Everything a launcher needs besides the trainer's own arguments."""

    launcher: str
    """mpirun, deepspeed or torchrun."""
    nodes: int
    """Machines (MPIJob workers); 1 for a local run."""
    procs_per_node: int
    """Ranks per machine (GPUs per worker, or CPU processes locally)."""
    trainer_args: list[str]
    """Arguments after `python -m shardbench.trainer`."""
    hostfile: str | None = None
    """Hostfile path for mpirun and deepspeed; None runs every rank on this machine."""
    master_addr: str = "127.0.0.1"
    """Rendezvous address of rank 0."""
    master_port: int = 29500
    """Rendezvous TCP port."""
    forward_env: list[str] = field(default_factory=list)
    """Extra variable names mpirun forwards to the ranks (NCCL_* and the like)."""
    python: str = "python"
    """Interpreter the ranks run."""
    tcp_if_include: str | None = None
    """Network interface(s) OpenMPI's TCP transport may use (e.g. eth0, lo); None: OpenMPI picks.
    The DeepSpeed launcher otherwise forces eth0, which a laptop or a pod may not have."""
    numa_bind: bool = False
    """Bind each rank to a NUMA domain (procs_per_node ranks per machine) instead of leaving it free."""
    numa_nodes: int = 2
    """NUMA domains per machine (`lscpu`: NUMA node(s)), with numa_bind: 2 for two sockets, more
    under AMD NPS2/NPS4 or Intel SNC. Too few puts every rank on the first sockets' domains; too
    many leaves too few slots and mpirun refuses to start."""
    program: tuple[str, ...] = ("-m", "shardbench.trainer")
    """What each rank's python runs, before trainer_args (mpirun only; the chart's pre-flight
    runs its script this way)."""

    max_restarts: int = 0
    """ray only: relaunches of the whole group after a failed rank (FailureConfig max_failures)."""
    ray_local: bool = False
    """ray only: start an embedded Ray on this machine instead of joining RAY_ADDRESS's cluster."""
    ray_gpus_per_rank: float = 0
    """ray only: GPUs each rank's actor reserves (Ray then gives it CUDA_VISIBLE_DEVICES of its own)."""
    ray_temp_dir: str | None = None
    """ray only, with ray_local: Ray's temp dir (short: Ray's socket paths live under it)."""

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def nccl_env_names(environ: dict[str, str] | None = None) -> list[str]:
    """Names of the NCCL_* variables set here: they must reach every rank, not just the launcher."""
    env = os.environ if environ is None else environ
    return sorted(k for k in env if k.startswith("NCCL_"))


def _mca_flags(plan: LaunchPlan) -> list[str]:
    return ["--mca", "btl_tcp_if_include", plan.tcp_if_include] if plan.tcp_if_include else []


def _mpirun_flags(plan: LaunchPlan) -> list[str]:
    """The mpirun options both launchers pass (the DeepSpeed runner inside --launcher_args)."""
    binding = (numa_bound_flags(procs_per_numa(plan.procs_per_node, plan.numa_nodes)) if plan.numa_bind
               else list(UNBOUND_FLAGS))
    return [*MPIRUN_BASE_FLAGS, *binding, *_mca_flags(plan)]


def forwarded_env(plan: LaunchPlan) -> list[str]:
    """Names every rank gets from the launcher's environment, in the order they are passed."""
    return [*RUN_ENV_VARS, *sorted(set(plan.forward_env) - set(RUN_ENV_VARS))]


def _export_flags(names: list[str]) -> list[str]:
    # -x NAME: mpirun copies the value verbatim from its own environment.
    return [flag for name in names for flag in ("-x", name)]


def mpirun_command(plan: LaunchPlan) -> list[str]:
    cmd = ["mpirun", *_mpirun_flags(plan), "-np", str(plan.world_size)]
    if plan.hostfile:
        cmd += ["--hostfile", plan.hostfile]
    cmd += _export_flags(forwarded_env(plan))
    return cmd + [plan.python, "-u", *plan.program, *plan.trainer_args]


def deepspeed_command(plan: LaunchPlan) -> list[str]:
    """The DeepSpeed launcher over OpenMPI. Its OpenMPI runner starts one rank per hostfile slot
    (it rejects --num_nodes/--num_gpus), so the hostfile must hold exactly world_size slots.
    --force_multi: a one-host hostfile goes through mpirun too, as on the cluster;
    --no_ssh_check: no sshd on a laptop or CI.
    Every forwarded variable goes to the ranks as an mpirun -x flag inside --launcher_args, as
    under mpirun: DeepSpeed's own forwarding covers only a few prefixes (NCCL_* only when the
    launcher itself sees a GPU, which an MPIJob launcher does not), and its .deepspeed_env file
    route wraps values holding characters such as ^ or a space in literal double quotes
    (multinode_runner.add_export; the openmpi runner runs mpirun without a shell), which would
    turn NCCL_SOCKET_IFNAME=^docker,lo into a name NCCL cannot match."""
    launcher_args = [
        *_mpirun_flags(plan),
        "-x", f"MASTER_ADDR={plan.master_addr}",
        "-x", f"MASTER_PORT={plan.master_port}",
        *_export_flags([n for n in forwarded_env(plan) if n not in ("MASTER_ADDR", "MASTER_PORT")]),
    ]
    return [
        "deepspeed",
        "--hostfile", plan.hostfile or "hostfiles/local",
        "--launcher", "openmpi",
        "--force_multi",
        "--no_ssh_check",
        "--master_addr", plan.master_addr,
        "--master_port", str(plan.master_port),
        "--launcher_args", " ".join(launcher_args),
        "--module", "shardbench.trainer",
        *plan.trainer_args,
    ]


def torchrun_command(plan: LaunchPlan) -> list[str]:
    # torchrun is single-node here (the cluster path is MPI); rendezvous on the given address.
    return [
        "torchrun",
        "--nnodes", str(plan.nodes),
        "--nproc-per-node", str(plan.procs_per_node),
        "--master-addr", plan.master_addr,
        "--master-port", str(plan.master_port),
        "-m", "shardbench.trainer",
        *plan.trainer_args,
    ]


def ray_command(plan: LaunchPlan) -> list[str]:
    """Ray as the launcher (trainer/ray_launcher.py): one actor per rank, the group relaunched up
    to plan.max_restarts times; `--local` starts an embedded Ray (no hostfile, no cluster)."""
    cmd = [plan.python, "-m", "shardbench.trainer.ray_launcher", "--world-size", str(plan.world_size),
           "--ranks-per-node", str(plan.procs_per_node), "--max-restarts", str(plan.max_restarts)]
    if plan.ray_gpus_per_rank:
        cmd += ["--gpus-per-rank", f"{plan.ray_gpus_per_rank:g}"]
    if plan.ray_local:
        cmd += ["--local"] + (["--temp-dir", plan.ray_temp_dir] if plan.ray_temp_dir else [])
    return cmd + ["--", *plan.trainer_args]


def remove_stale_mpi_sessions(base: str | None = None) -> list[str]:
    """Remove the session dirs a killed prterun left (`<base>/ompi.<pid>`, base: $TMPDIR or /tmp)
    whose pid no longer runs; returns them. PRRTE names the dir by its own pid and removes it on a
    clean exit only, so a SIGKILLed mpirun (a cancel, a timeout, a fault) leaves it, and a later
    prterun that gets the same pid (pids wrap at 32768 in many containers) cannot start:
    "The PMIx server's listener thread failed to start", exit 213 (one such failure in a test
    session here; reproduced in tests/suite/test_mpi_sessions.py). Only this user's dirs."""
    import shutil
    import tempfile

    base = base or tempfile.gettempdir()
    removed = []
    for name in os.listdir(base) if os.path.isdir(base) else []:
        pid = name.removeprefix("ompi.")
        path = os.path.join(base, name)
        if name == pid or not pid.isdigit() or _pid_lives(int(pid)):
            continue
        try:
            if os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_lives(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


BUILDERS = {"mpirun": mpirun_command, "deepspeed": deepspeed_command, "torchrun": torchrun_command,
            "ray": ray_command}


def build_command(plan: LaunchPlan) -> list[str]:
    """The argv that starts `plan.world_size` trainer ranks with `plan.launcher`. The trainer is
    told which launcher started it (--launcher): the DeepSpeed launcher's ranks otherwise look
    exactly like mpirun's."""
    if plan.launcher not in BUILDERS:
        raise ValueError(f"unknown launcher {plan.launcher!r}: use one of {', '.join(LAUNCHERS)}")
    if "--launcher" not in plan.trainer_args:
        plan = replace(plan, trainer_args=[*plan.trainer_args, "--launcher", plan.launcher])
    return BUILDERS[plan.launcher](plan)
