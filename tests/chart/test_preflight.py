"""The pre-flight (`mode: preflight`): files/preflight.py measures all-reduce bus bandwidth on every
rank, started by the chart's launcher exactly as trainer/launchers.py would; across two emulated
worker pods it passes with its numbers, and fails with one line when the fabric is below what
the shape expects."""
from __future__ import annotations

import importlib.util

import pytest

from chart_helpers import CHART, NAMESPACE, RELEASE, launcher_argv, one, render
from test_emulated_mpijob import emulation_ready, run_emulated  # noqa: F401 - a fixture
from trainer.launchers import CONTAINER_ENV_VARS, LaunchPlan, build_command

spec = importlib.util.spec_from_file_location("preflight", CHART / "files" / "preflight.py")
preflight = importlib.util.module_from_spec(spec)
spec.loader.exec_module(preflight)
JOB = f"{RELEASE}-shardbench"


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
    args = ["--sizes-mib", "1", "16", "256", "--iters", "20", "--warmup-iters", "5", "--device", "cuda",
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
    else:
        assert proc.returncode != 0 and "preflight: FAIL: busbw" in proc.stderr, out[-3000:]
        assert "below 0.5 x the expected 1e+06 GB/s" in proc.stderr
