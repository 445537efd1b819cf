"""The pre-flight (`mode: preflight`): files/preflight.py measures all-reduce bus bandwidth on every
rank, started by the chart's launcher exactly as trainer/launchers.py would; across two emulated
worker pods it passes with its numbers, and fails with one line when the fabric is below what
the shape expects."""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys

import pytest

from chart_helpers import CHART, NAMESPACE, RELEASE, launcher_argv, one, render
from test_emulated_mpijob import emulation_ready, run_emulated  # noqa: F401 - a fixture
from shardbench.trainer.launchers import CONTAINER_ENV_VARS, LaunchPlan, build_command

spec = importlib.util.spec_from_file_location("preflight", CHART / "files" / "preflight.py")
preflight = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preflight)
JOB = f"{RELEASE}-shardbench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = preflight.bus_bandwidth(8 * 10**9, 0.1, 8)  # 8 GB in 0.1 s on 8 ranks
    assert algbw == pytest.approx(80.0) and busbw == pytest.approx(80.0 * 2 * 7 / 8)


def test_verdict_compares_across_nodes_only():
    assert preflight.verdict(10.0, 400.0, 0.5, nodes=1) is None  # NVLink, not the fabric
    assert preflight.verdict(250.0, 400.0, 0.5, nodes=2) is None
    assert preflight.verdict(10.0, None, 0.5, nodes=2) is None
    line = preflight.verdict(10.0, 400.0, 0.5, nodes=2)
    assert line.startswith("preflight: FAIL: busbw 10.00 GB/s across 2 nodes is below 0.5 x the expected 400 GB/s")


def test_preflight_command_is_build_command():
    sets = ("mode=preflight", "workers=2", "launcher=deepspeed", "preflight.expectedBusbwGBps=400")
    job = one(render("helm3", ("h100.yaml",), sets), "MPIJob")
    # The shape's sweep (to 8 GiB or the plateau) and its RDMA mode (memlock and transport checks).
    args = ["--min-size-mib", "1", "--max-size-mib", "8192", "--plateau-gain", "0.05", "--rdma-mode", "host-network",
            "--iters", "20", "--warmup-iters", "5", "--device", "cuda",
            "--min-fraction", "0.5", "--expected-busbw-gbps", "400"]
    values_nccl = ["NCCL_CUMEM_ENABLE", "NCCL_IB_GID_INDEX", "NCCL_IB_HCA", "NCCL_IB_SL", "NCCL_IB_SPLIT_DATA_ON_QPS",
                   "NCCL_IB_TC", "NCCL_IB_TIMEOUT", "NCCL_IGNORE_CPU_AFFINITY", "NCCL_SOCKET_IFNAME"]
    plan = LaunchPlan(launcher="mpirun", nodes=2, procs_per_node=8, trainer_args=args, hostfile="/etc/mpi/hostfile",
                      master_addr=f"{JOB}-worker-0.{JOB}.{NAMESPACE}.svc",
                      forward_env=[*CONTAINER_ENV_VARS, *values_nccl, "PYTHONWARNINGS"], numa_bind=True,
                      program=("/etc/shardbench/preflight.py",))
    # mpirun whatever `launcher` says, and no --launcher flag: the script is not the trainer.
    assert launcher_argv(job) == build_command(plan)[: -2]
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert {"name": "config", "mountPath": "/etc/shardbench", "readOnly": True} in worker["volumeMounts"]


@pytest.mark.slow
@pytest.mark.parametrize("expected,passes", [(None, True), (1e6, False)])
def test_preflight_across_two_emulated_workers(emulation_ready, tmp_path, expected, passes):
    extra = ("mode=preflight", "preflight.sizesMiB={1,2}", "preflight.iters=3", "preflight.warmupIters=1")
    if expected:
        extra += (f"preflight.expectedBusbwGBps={int(expected)}",)
    proc, _ = run_emulated(tmp_path, "mpirun", extra_sets=extra)
    out = proc.stdout + proc.stderr
    assert "preflight: all-reduce over 2 ranks on 2 node(s), gloo" in out, out[-3000:]
    rows = [l.split() for l in proc.stdout.splitlines() if l.strip() and l.split()[0] in ("1048576", "2097152")]
    assert len(rows) == 2 and all(float(r[3]) > 0 for r in rows), proc.stdout
    if passes:
        assert proc.returncode == 0 and "preflight: ok: busbw" in proc.stdout, out[-3000:]
        assert "preflight: transport: gloo (TCP)" in proc.stdout
    else:
        assert proc.returncode != 0 and "preflight: FAIL: busbw" in proc.stderr, out[-3000:]
        assert "below 0.5 x the expected 1e+06 GB/s" in proc.stderr


# --- memory registration, transport, sweep (issue 20) -------------------------------------------

def test_memlock_check():
    unlimited, limited = preflight.resource.RLIM_INFINITY, 64 * 1024
    ipc_lock = 1 << preflight.CAP_IPC_LOCK
    assert preflight.memlock_problem(limited, 0, "none") is None  # sockets register nothing
    assert preflight.memlock_problem(unlimited, 0, "sriov") is None
    assert preflight.memlock_problem(limited, ipc_lock, "host-network") is None
    line = preflight.memlock_problem(limited, 0, "sriov")
    assert line.startswith("memlock limit 64 KiB and no CAP_IPC_LOCK") and "ibv_reg_mr" in line
    assert "rdma.runAsRoot: true" in line and "LimitMEMLOCK=infinity" in line


# NCCL's INIT line (src/init.cc: INFO(NCCL_INIT, "Using network %s", ...)), as NCCL_DEBUG_FILE holds it.
NCCL_IB_LOG = "h100-0:1234:1300 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE\n" \
              "h100-0:1234:1300 [0] NCCL INFO Using network IB\n"
NCCL_SOCKET_LOG = "h100-0:1234:1300 [0] NCCL INFO NET/IB : No device found.\n" \
                  "h100-0:1234:1300 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>\n" \
                  "h100-0:1234:1300 [0] NCCL INFO Using network Socket\n"


def test_transport_is_read_from_nccls_log_and_sockets_fail_a_fabric_shape():
    assert preflight.nccl_network(NCCL_IB_LOG) == "IB"
    assert preflight.nccl_network(NCCL_SOCKET_LOG) == "Socket"
    assert preflight.nccl_network("nothing here\n") is None
    assert preflight.transport_problem("IB", "sriov") is None
    assert preflight.transport_problem("Socket", "none") is None  # a socket shape (a10)
    line = preflight.transport_problem("Socket", "sriov")
    assert line.startswith("NCCL chose its Socket transport although rdma.mode is sriov") and "NCCL_IB_HCA" in line


def test_sweep_doubles_to_the_cap_and_stops_at_the_plateau():
    args = preflight.parse(["--min-size-mib", "1", "--max-size-mib", "8192"])
    assert preflight.sweep_sizes(args, None) == [2.0**k for k in range(14)]
    assert preflight.sweep_sizes(args, 64 * 2**20)[-1] == 64  # what memory allows
    assert preflight.sweep_sizes(preflight.parse(["--sizes-mib", "1", "16"]), None) == [1, 16]
    assert not preflight.plateaued([10, 20, 40], 0.05)
    assert not preflight.plateaued([10, 20, 20.5], 0.05)  # one flat doubling is not a plateau
    assert preflight.plateaued([10, 20, 20.5, 20.6], 0.05)


def _run_preflight(tmp_path, *wrap: str, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    return subprocess.run([*wrap, sys.executable, str(CHART / "files" / "preflight.py"), "--device", "cpu",
                           "--iters", "1", "--warmup-iters", "0", *args],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)


@pytest.mark.slow  # three interpreters importing torch
def test_a_rank_without_lockable_memory_fails_naming_the_fix(tmp_path):
    """The real check: a 64 KiB memlock limit (prlimit) and no CAP_IPC_LOCK (dropped from the
    bounding set, so not even root keeps it across exec), as a non-root rank in a stock container."""
    # This project's tests run as root (tmpfs mounts, the emulated MPIJob); util-linux is Debian's base.
    assert os.geteuid() == 0 and shutil.which("setpriv") and shutil.which("prlimit"), \
        "needs root, setpriv and prlimit (util-linux) to drop CAP_IPC_LOCK"
    locked_down = ("prlimit", "--memlock=65536:65536", "setpriv", "--bounding-set", "-ipc_lock",
                   "--inh-caps", "-ipc_lock")
    proc = _run_preflight(tmp_path, *locked_down, args=("--rdma-mode", "sriov", "--sizes-mib", "1"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "preflight: FAIL: rank 0 on " in proc.stderr and "memlock limit 64 KiB and no CAP_IPC_LOCK" in proc.stderr
    # The same limits pass where nothing is registered (sockets), and IPC_LOCK alone suffices.
    assert _run_preflight(tmp_path, *locked_down, args=("--rdma-mode", "none", "--sizes-mib", "1")).returncode == 0
    ok = _run_preflight(tmp_path, "prlimit", "--memlock=65536:65536", args=("--rdma-mode", "sriov", "--sizes-mib", "1"))
    assert ok.returncode == 0 and "preflight: ok" in ok.stdout, ok.stderr


# NCCL's connection lines (transport/net.cc) and its IB plugin's GDR line (net_ib.cc), as in NCCL_DEBUG_FILE.
NCCL_GDR_LOG = NCCL_IB_LOG + \
    "h100-0:1234:1300 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_0'\n" \
    "h100-0:1234:1300 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"
NCCL_NO_GDR_LOG = NCCL_IB_LOG + \
    "h100-0:1234:1300 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)\n" \
    "h100-0:1234:1300 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0\n"


def test_preflight_reports_whether_gpudirect_rdma_is_in_use():
    """Issue 34: the pre-flight said which network NCCL chose, not whether it reads GPU memory
    directly (without GPUDirect RDMA every transfer is staged through host memory)."""
    assert preflight.gpudirect_rdma(NCCL_GDR_LOG) is True
    assert preflight.gpudirect_rdma(NCCL_NO_GDR_LOG) is False
    assert preflight.gpudirect_rdma(NCCL_IB_LOG) is None  # no connection to another node
    assert preflight.gdr_line(True, "sriov") == "preflight: GPUDirect RDMA: in use"
    assert "nvidia-peermem" in preflight.gdr_line(False, "host-network")
    assert preflight.gdr_line(False, "none") == "preflight: GPUDirect RDMA: not in use"
    assert preflight.gdr_line(None, "sriov").startswith("preflight: GPUDirect RDMA: unknown")
