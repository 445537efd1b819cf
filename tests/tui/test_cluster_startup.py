"""launcher_startup_s on the cluster, against the kmock emulator (only the Kubernetes API is
emulated; helm 3, the chart, the client and the backend are real). The pods' /proc is out of the
suite's reach there, so the interval is read from the start stamps in the job's log
(suite/execute/startup.py): the launch command's (the image's entrypoint as it execs the MPIJob's launch
command; the RayJob's driver) to the last rank's own process start. The test plays the MPI
Operator / KubeRay and serves a log with those stamps, as the real entrypoint, driver and ranks
print them (tests/chart/test_dockerfile.py and tests/trainer/test_cli.py check that they do)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from shardbench.suite.execute.startup import StampClock

from .kube_emulator import add_pod, serve_log, set_conditions, wait_for_mpijob
from .test_kube_backend import backend, cluster, helm, launcher_log, run_in_thread, spec  # noqa: F401
from .test_kuberay_backend import add_submitter, ray_spec, set_status, wait_for_rayjob
from .test_kuberay_backend import backend as ray_backend
from .test_kuberay_backend import cluster as ray_cluster  # noqa: F401

HELM3 = pytest.mark.parametrize("helm", ["helm3"], indirect=True)
STAMPS = ["shardbench-entrypoint: every worker answers ssh (2 hosts, 3s)",
          'SHARDBENCH_START {"launcher": 1764000000.500}',
          '[1,1]<stderr>:SHARDBENCH_START {"rank": 1, "t": 1764000001.875}',
          '[1,0]<stderr>:SHARDBENCH_START {"rank": 0, "t": 1764000001.250}']


def test_stamp_clock_needs_every_rank_and_keeps_the_first_launch():
    clock = StampClock(2)
    for line in STAMPS[:3]:
        clock.feed(line)
    assert clock.seconds() is None  # rank 0 not started yet: not a start-up time
    clock.feed(STAMPS[3])
    clock.feed('[1,1]<stderr>:SHARDBENCH_START {"rank": 1, "t": 1764000090.0}')  # a relaunched rank
    clock.feed("SHARDBENCH_START {garbled")
    assert clock.seconds() == 1.375


@HELM3
async def test_mpijob_record_gets_launcher_startup_from_the_start_stamps(cluster, tmp_path):  # noqa: F811
    emu, kubeconfig, helm = cluster
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created", "Running")
        pod = add_pod(emu, name, "launcher", "Running")
        await serve_log(emu, pod, STAMPS + launcher_log(s, 100.0)).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm), s, tmp_path / "run")
    await op
    assert record["status"] == "ok", record.get("error")
    assert record["launcher_startup_s"] == 1.375  # launch command -> last rank's process start


async def test_rayjob_record_gets_launcher_startup_from_the_drivers_and_ranks_stamps(ray_cluster, tmp_path):  # noqa: F811
    emu, kubeconfig = ray_cluster
    s = ray_spec()
    # The driver relays the ranks' lines unprefixed; its own stamp comes first.
    lines = [STAMPS[1], *(x.split(":", 1)[1] for x in STAMPS[2:]), *launcher_log(s, 200.0)]

    async def kuberay():
        name = (await wait_for_rayjob(emu))["metadata"]["name"]
        await set_status(emu, name, jobDeploymentStatus="Running", jobStatus="RUNNING")
        await serve_log(emu, add_submitter(emu, name), lines).task
        await set_status(emu, name, jobDeploymentStatus="Complete", jobStatus="SUCCEEDED")

    op = asyncio.create_task(kuberay())
    record = await asyncio.to_thread(ray_backend(kubeconfig).run, s, tmp_path / "run", lambda e: None,
                                     threading.Event(), 60)
    await op
    assert record["status"] == "ok", record.get("error")
    assert record["launcher_startup_s"] == 1.375
