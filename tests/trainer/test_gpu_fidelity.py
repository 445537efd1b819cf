"""GPU fidelity on CPU: every CUDA-only branch that a CPU can drive, driven here (issue 34).

What is proven on CPU:
- The device rule of NCCL (it serves CUDA tensors only): a `cuda:gloo` process group has the
  same device-to-backend map and refuses a CPU tensor exactly as NCCL would.
- The pre-flight's timing exchange and the async checkpoint's commit poll hand collectives only
  tensors on the run's device: `device_strict` replaces torch.distributed's collectives with a
  check (every tensor on the run's device) that skips the real call, and the run's device is
  `meta`, which no tensor made without `device=` lands on.
- The collective counter's CUDA branch (NCCL's per-work timer) keeps no Work, hence no output
  tensor: a fake Work that holds its outputs is freed with the caller's last reference, and the
  seconds still arrive through the process group's completion hook (a fake NCCL group).
- The counter adds no memory to the tensor peak of any strategy with its CUDA branch forced
  (ddp, fsdp, zero1/2/3 at world size 2 on gloo).
- The Ray launcher's device mapping with several GPUs per node (a faked device count and
  CUDA_VISIBLE_DEVICES): every rank's `set_device(int(os.environ["LOCAL_RANK"]))` gets a valid
  ordinal, and a run's ranks are packed per node by a placement group (a two-node Ray cluster
  with fake GPUs, slow).
- NUMA binding: OpenMPI 5's mapper on synthetic two-socket NPS1 and NPS4 topologies puts local
  ranks 0-3 on socket 0 and 4-7 on socket 1.
- The allocator figures (record memory, the exporter's gauges) and the pre-flight's size cap
  read torch.cuda's counters (faked); a GPU rank joins NCCL with TORCH_NCCL_ENABLE_TIMING set
  before its group is made (the counter's seconds depend on it).

What only a GPU can still show:
- NCCL itself: that the completion hook fires for every timed work under TORCH_NCCL_ENABLE_TIMING,
  with sequence numbers matching `_get_sequence_number_for_group` (coalesced works included),
  the durations it reports, and that the watchdog's copies of a work hold no outputs.
- The pre-flight end to end on NCCL (CUDA tensors cannot exist here: its collectives are checked
  on meta), and the async checkpoint's poll on a real NCCL group.
- The CUDA caching allocator's own figures (max_memory_allocated) as opposed to the tensor peak,
  and stream-ordering effects on memory reuse.
- NVLink/P2P and GPUDirect RDMA transports, NCCL's topology detection, real busbw numbers.
- NVML itself: the exporter's GPU gauges read it through torch.cuda.utilization/temperature
  (nvidia-ml-py); here those two calls are faked, so only the branch and the units are checked.
- OpenMPI's binding on real sockets/NUMA nodes and the GPUs' real socket affinity (the mapper is
  checked on synthetic topologies that assume GPUs 0-3 on socket 0).
"""
from __future__ import annotations

import contextlib
import json
import importlib.util
import subprocess
import sys
import textwrap
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from tests.trainer.conftest import cpu_env, free_port

REPO = Path(__file__).resolve().parents[2]
RUN_DEVICE = torch.device("meta")  # not the host's default: a tensor made without device= is caught

_spec = importlib.util.spec_from_file_location("preflight_fidelity", REPO / "chart" / "files" / "preflight.py")
preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight)


@contextlib.contextmanager
def device_strict(monkeypatch, device: torch.device):
    """torch.distributed's collectives replaced by a check that every tensor handed to them is on
    `device` (skipping the real call); yields the devices seen. Meta tensors hold no values, so
    reading one back gives 0."""
    seen: list[torch.device] = []

    def check(*args, **kwargs):
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for t in tensors:
            seen.append(t.device)
            assert t.device == device, f"a collective was handed a tensor on {t.device}, the run's device is {device}"
        return None

    for name in ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "barrier"):
        monkeypatch.setattr(dist, name, check)
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: 0 if t.is_meta else item(t))
    yield seen


# --- 1. the pre-flight ---------------------------------------------------------------------------

CUDA_ONLY_GROUP = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    rank, port = int(sys.argv[1]), sys.argv[2]
    # The device -> backend map of an NCCL group: CUDA only (gloo serves it on this host).
    dist.init_process_group(backend="cuda:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        dist.all_reduce(torch.tensor([1.0], dtype=torch.float64), op=dist.ReduceOp.MAX)
        print("accepted")
    except RuntimeError as exc:
        print("refused:", exc)
""")


def test_a_cuda_only_group_refuses_a_cpu_tensor_as_nccl_does():
    """The rule the strict check below enforces, shown on a real group: a backend map with CUDA
    only (NCCL's: Backend.backend_capability["nccl"] == ["cuda"]) refuses the CPU float64 that the
    pre-flight used to all-reduce."""
    assert dist.Backend.backend_capability["nccl"] == ["cuda"]
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, "-c", CUDA_ONLY_GROUP, str(rank), port], env=cpu_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for out, err in outs:
        assert "refused: No backend type associated with device type cpu" in out, (out, err[-2000:])


def test_preflight_hands_collectives_tensors_on_the_runs_device_only(monkeypatch):
    with device_strict(monkeypatch, RUN_DEVICE) as seen:
        tensor = torch.ones(4, device=RUN_DEVICE)
        assert preflight.time_all_reduce(tensor, iters=2, warmup=1, device=RUN_DEVICE) == 0
    assert len(seen) == 4  # warm-up, two timed, the slowest rank's mean


# --- 2. the async checkpoint's commit poll -------------------------------------------------------

def test_async_checkpoint_poll_hands_collectives_tensors_on_the_runs_device_only(monkeypatch, tmp_path):
    from shardbench.trainer.checkpoint import Checkpointer
    from shardbench.trainer.config import RunConfig

    strategy = SimpleNamespace(ctx=SimpleNamespace(device=RUN_DEVICE))
    ckpt = Checkpointer(RunConfig(strategy="fsdp", checkpoint_dir=str(tmp_path)), strategy, rank=0, world_size=2)
    monkeypatch.setattr(ckpt, "_group", lambda: True)  # as in a two-rank run
    monkeypatch.setattr(ckpt, "wait", lambda: setattr(ckpt, "_pending", None))
    done = Future()
    done.set_result(None)
    ckpt._pending = (done, None, None, 0.0)
    with device_strict(monkeypatch, RUN_DEVICE) as seen:
        # The meta flag reads back 0 (not done): the save stays pending, which is all this needs.
        assert ckpt.poll() is True
    assert seen == [RUN_DEVICE]


# --- 3. the collective counter's CUDA branch ------------------------------------------------------

class FakeNcclGroup:
    """What the counter uses of a ProcessGroupNCCL: its collective sequence number and its
    completion hook (fired by NCCL's watchdog with a copy of the work that has no outputs)."""

    def __init__(self) -> None:
        self.seq, self.hook = 0, None

    def _register_on_completion_hook(self, hook) -> None:
        self.hook = hook

    def _get_sequence_number_for_group(self) -> int:
        return self.seq

    def finish(self, op_type: str, seq: int, ms: float) -> None:
        from datetime import timedelta

        self.hook(SimpleNamespace(op_type=SimpleNamespace(name=op_type), seq=seq,
                                  active_duration=timedelta(milliseconds=ms)))


class FakeNcclWork:
    """Holds its output tensors as ProcessGroupNCCL's WorkNCCL does; its future completes at enqueue."""

    def __init__(self, outputs) -> None:
        self.outputs = outputs

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(self.outputs)
        return future

    def wait(self) -> bool:
        return True


def test_the_counter_keeps_no_cuda_work_and_still_gets_nccls_seconds(monkeypatch):
    import gc
    import weakref

    from shardbench.trainer import comm

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        group.seq += 1
        return FakeNcclWork([output_tensor])

    monkeypatch.setattr(comm, "_on_cuda", lambda value: True)  # the branch every CUDA tensor takes
    counter, group = comm.CommCounter(), FakeNcclGroup()
    counted = counter._wrap(all_gather_into_tensor, "all_gather", 0, "output_tensor", None)
    counter.active = True
    output = torch.empty(1024)
    work = counted(output, torch.empty(512), group=group, async_op=True)
    work.wait()
    freed = weakref.ref(output)
    del work, output  # what FSDP does once it copied the gathered parameters out
    gc.collect()
    assert freed() is None, "the counter kept the work, and with it the gathered buffer"
    assert counter.calls == {"all_gather": 1} and counter.bytes == {"all_gather": 4096}
    group.finish("_ALLGATHER_BASE", 1, ms=7.0)  # NCCL's timer, from the watchdog's thread
    group.finish("SEND", 1, ms=1000.0)  # point-to-point works are numbered apart: not this one
    counter.settle(timeout_s=1.0)
    assert counter.seconds == {"all_gather": pytest.approx(0.007)}
    assert counter.per_step(1)["all_gather"]["seconds"] == pytest.approx(0.007)


def test_a_group_without_a_completion_hook_is_counted_untimed(monkeypatch):
    """gloo refuses the hook ("Only ProcessGroupNCCL supports onCompletion hook"): calls and
    bytes still count, no seconds, nothing kept."""
    from shardbench.trainer import comm

    class GlooLike(FakeNcclGroup):
        def _register_on_completion_hook(self, hook) -> None:
            raise RuntimeError("Only ProcessGrouppNCCL supports onCompletion hook, but got gloo backend.")

    def all_reduce(tensor, op=None, group=None, async_op=False):
        group.seq += 1

    monkeypatch.setattr(comm, "_on_cuda", lambda value: True)
    counter = comm.CommCounter()
    counted = counter._wrap(all_reduce, "all_reduce", 0, "tensor", None)
    counter.active = True
    counted(torch.ones(4), group=GlooLike())
    counter.settle(timeout_s=0.0)
    assert counter.calls == {"all_reduce": 1} and counter.seconds == {}
    assert not counter._expected


PEAK = textwrap.dedent("""
    import json, os, sys
    from shardbench.trainer import comm
    from shardbench.trainer.cli import parse_args
    from shardbench.trainer.dist_env import detect
    from shardbench.trainer.train import Trainer
    cfg = parse_args(["--strategy", sys.argv[1], "--model", "tiny", "--seq-len", "32", "--micro-batch", "2",
                      "--grad-accum", "1", "--steps", "2", "--warmup-steps", "1", "--precision", "fp32",
                      "--device", "cpu"])
    t = Trainer(cfg, detect())
    t.init_process_group()
    t.build()
    t.train(0.0)  # two steps and a first memory step: every lazily made state exists
    batches = t.data.step_batches(cfg.steps)
    peaks = {}
    for case in ("uncounted", "counted", "uncounted after counting"):
        comm._on_cuda = lambda value, cuda=case == "counted": cuda  # the counter's CUDA branch, on gloo
        comm.COUNTER.reset()
        comm.COUNTER.active = case == "counted"
        t.steps.memory_step(batches)
        comm.COUNTER.active = False
        peaks[case] = t.steps.tensor_peak
        peaks[case + " calls"] = sum(comm.COUNTER.calls.values())
    if t.dist.rank == 0:
        print("PEAKS " + json.dumps(peaks), flush=True)
    os._exit(0)
""")


def _peak_cases():
    """Every row of the contract's table (a new row is checked too)."""
    from shardbench.trainer.contract import STRATEGIES

    return list(STRATEGIES)


@pytest.mark.slow  # two processes per case, 5-9 s idle each
@pytest.mark.parametrize("strategy", _peak_cases())
def test_counting_adds_nothing_to_the_tensor_peak(strategy):
    """The tensor peak of the memory step with the counter's CUDA branch counting equals the
    peak without counting (before: fsdp +12.5 MB, zero3 +34.4 MB on this tiny model, kept until
    the next settle)."""
    port = str(free_port())
    procs = []
    for rank in (0, 1):
        env = dict(cpu_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
        procs.append(subprocess.Popen([sys.executable, "-c", PEAK, strategy], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-3000:] for o in outs]
    line = next(text for text in outs[0][0].splitlines() if text.startswith("PEAKS "))
    peaks = json.loads(line.split(" ", 1)[1])
    assert peaks["counted calls"] > 0 and peaks["uncounted calls"] == 0, peaks
    assert peaks["counted"] == peaks["uncounted"] == peaks["uncounted after counting"], peaks


# --- 4. NUMA binding: OpenMPI 5's mapper on synthetic topologies -----------------------------------

# hwloc's synthetic descriptions: two sockets with one NUMA domain each (an H100 node, Intel with
# SNC off), and two sockets with four each (AMD NPS4). 16 cores per socket, 8 GPUs per node.
TOPOLOGIES = {2: "pack:2 numa:1 core:16 pu:1", 8: "pack:2 numa:4 core:4 pu:1"}


def _mapped(flags: list[str], topology: str, hostfile: Path, np: int) -> list[tuple[str, int, str]]:
    """(node, local rank, binding) per rank, in rank order, from mpirun's --display map; nothing
    is launched (--do-not-launch), and hwloc takes the synthetic topology as this machine's."""
    import re

    env = dict(cpu_env(), HWLOC_SYNTHETIC=topology, HWLOC_THISSYSTEM="1")
    cmd = [str(Path(sys.executable).parent / "mpirun"), *flags, "--hostfile", str(hostfile), "--display", "map",
           "--do-not-launch", "-np", str(np), "true"]
    proc = subprocess.run(cmd, env=env, capture_output=True, timeout=120)
    out = (proc.stdout + proc.stderr).replace(b"\0", b"").decode(errors="replace")
    assert proc.returncode == 0, out[-3000:]
    ranks, node = {}, None
    for line in out.splitlines():
        if m := re.search(r"Data for node: (\S+)", line):
            node = m.group(1)
        elif m := re.search(r"Local rank: (\d+).*App rank: (\d+)", line):
            local, rank = int(m.group(1)), int(m.group(2))
        elif m := re.search(r"Binding: (\S+)", line):
            ranks[rank] = (node, local, m.group(1))
    assert sorted(ranks) == list(range(np)), out[-3000:]
    return [ranks[r] for r in range(np)]


@pytest.mark.parametrize("numa_nodes", sorted(TOPOLOGIES))
def test_numa_bound_ranks_fill_the_domains_in_local_rank_order(tmp_path, numa_nodes):
    """The launch command's binding flags (trainer/launchers.py, which the chart's template
    matches flag for flag) on two 8-GPU nodes: local ranks 0-3 on socket 0 and 4-7 on socket 1
    (the GPUs' sockets), each NUMA domain holding ceil(8 / domains) of them in order. Before:
    `--map-by ppr:8:node` bound all 8 to socket 0."""
    from shardbench.trainer.launchers import LaunchPlan, _mpirun_flags

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("worker-0 slots=8\nworker-1 slots=8\n")
    plan = LaunchPlan(launcher="mpirun", nodes=2, procs_per_node=8, trainer_args=[], numa_bind=True,
                      numa_nodes=numa_nodes)
    mapped = _mapped(_mpirun_flags(plan), TOPOLOGIES[numa_nodes], hostfile, np=16)
    per_numa = 8 // numa_nodes
    for rank, (node, local, binding) in enumerate(mapped):
        assert node == f"worker-{rank // 8}" and local == rank % 8, mapped
        assert binding.startswith(f"package[{local // 4}]"), mapped  # the GPU's socket
    # One NUMA domain per group of per_numa local ranks, a different one for each group.
    domains = [binding for _, local, binding in mapped[:8]]
    assert len(set(domains)) == numa_nodes and all(
        domains[i] == domains[i - i % per_numa] for i in range(8)), domains


# --- 6. the Ray launcher on nodes with several GPUs ------------------------------------------------

def fake_cuda(monkeypatch, env: dict[str, str]) -> list[int]:
    """torch.cuda as a rank with `env` would see it: as many devices as CUDA_VISIBLE_DEVICES names;
    set_device refuses an ordinal past them as CUDA does. Returns the ordinals set."""
    visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
    chosen: list[int] = []

    def set_device(ordinal: int) -> None:
        if not 0 <= ordinal < len(visible):
            raise RuntimeError(f"CUDA error: invalid device ordinal {ordinal} ({len(visible)} visible)")
        chosen.append(ordinal)

    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(visible))
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return chosen


def zero_engine_device(monkeypatch, env: dict[str, str]) -> str:
    """DeepSpeed's engine on this rank: set_device(int(os.environ["LOCAL_RANK"])); the physical GPU."""
    chosen = fake_cuda(monkeypatch, env)
    torch.cuda.set_device(int(env["LOCAL_RANK"]))
    return env["CUDA_VISIBLE_DEVICES"].split(",")[chosen[-1]]


# What Ray hands two 4-GPU nodes' actors (num_gpus=1 each): one GPU id per actor, in any order.
PLACEMENTS = [("node-a", ["2"]), ("node-a", ["0"]), ("node-a", ["3"]), ("node-a", ["1"]),
              ("node-b", ["0"]), ("node-b", ["1"]), ("node-b", ["2"]), ("node-b", ["3"])]


def test_every_ray_rank_selects_its_own_gpu_with_several_per_node(monkeypatch):
    from shardbench.trainer.ray_launcher import device_env

    envs = device_env(PLACEMENTS)
    for (node, own), env in zip(PLACEMENTS, envs):
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["LOCAL_WORLD_SIZE"] == "4"
        assert zero_engine_device(monkeypatch, env) == own[0]
    # Before: LOCAL_RANK = rank % ranks_per_node under Ray's one-GPU CUDA_VISIBLE_DEVICES.
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        zero_engine_device(monkeypatch, {"CUDA_VISIBLE_DEVICES": "0", "LOCAL_RANK": "1"})
    # CPU ranks: local ranks in rank order per node, nothing made visible.
    assert device_env([("a", []), ("a", []), ("b", [])]) == [
        {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"}, {"LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"},
        {"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}]


PROBE = textwrap.dedent("""
    import json, os
    visible = [d for d in os.environ["CUDA_VISIBLE_DEVICES"].split(",") if d]
    local = int(os.environ["LOCAL_RANK"])
    ok = 0 <= local < len(visible)  # what torch.cuda.set_device(LOCAL_RANK) needs
    # The node: the raylet that started this rank's actor (the actor is this process's parent).
    raylet = open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1]
    print("PROBE " + json.dumps({"rank": int(os.environ["RANK"]), "visible": visible, "local": local, "ok": ok,
                                 "gpu": visible[local] if ok else None, "raylet": raylet}), flush=True)
""")


@pytest.mark.slow  # a two-node Ray cluster on this machine: ~40 s
def test_ray_launcher_packs_ranks_per_node_and_maps_their_gpus(tmp_path):
    """The real launcher on a Ray cluster of two nodes with two (fake) GPUs each: ranks 0-1 on one
    node and 2-3 on the other (the placement group), each rank's LOCAL_RANK a valid ordinal of
    its node's GPUs, and no two ranks of a node on one GPU."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    python = tmp_path / "python"  # the launcher runs `<python> -u -m shardbench.trainer ...`: the probe instead
    python.write_text(f"#!/bin/sh\nexec {sys.executable} {probe}\n")
    python.chmod(0o755)
    script = textwrap.dedent(f"""
        import os, subprocess, sys
        from ray.cluster_utils import Cluster
        cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 2, "num_gpus": 2,
                                                                 "include_dashboard": False}})
        cluster.add_node(num_cpus=2, num_gpus=2)
        cluster.wait_for_nodes()
        try:
            out = subprocess.run([sys.executable, "-m", "shardbench.trainer.ray_launcher", "--world-size", "4",
                                  "--ranks-per-node", "2", "--gpus-per-rank", "1", "--python", {str(python)!r},
                                  "--", "--strategy", "zero2"], env=dict(os.environ, RAY_ADDRESS=cluster.address),
                                 capture_output=True, text=True, timeout=240)
            print(out.stdout)
            print(out.stderr[-3000:], file=sys.stderr)
        finally:
            cluster.shutdown()
    """)
    env = cpu_env()
    env.pop("CUDA_VISIBLE_DEVICES")  # Ray refuses fake GPUs that an empty list hides
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    probes = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert len(probes) == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    by_rank = {p["rank"]: p for p in probes}
    assert all(p["ok"] for p in probes), probes
    for node in ((0, 1), (2, 3)):
        assert [by_rank[r]["visible"] for r in node] == [["0", "1"], ["0", "1"]], probes
        assert sorted(by_rank[r]["gpu"] for r in node) == ["0", "1"], probes  # one GPU each
        assert by_rank[node[0]]["raylet"] == by_rank[node[1]]["raylet"], probes  # packed per node
    assert by_rank[0]["raylet"] != by_rank[2]["raylet"], probes


# --- 8. the other CUDA-only branches: allocator figures, the process group, the pre-flight's cap ---

class FakeAllocator:
    """torch.cuda's allocator counters as a GPU rank reads them (GiB-sized, distinct values)."""

    GiB = 2**30

    def __init__(self, monkeypatch) -> None:
        self.resets = 0
        fake = {"synchronize": lambda device=None: None,
                "memory_allocated": lambda device=None: 3 * self.GiB,
                "memory_reserved": lambda device=None: 5 * self.GiB,
                "max_memory_allocated": lambda device=None: 4 * self.GiB,
                "max_memory_reserved": lambda device=None: 6 * self.GiB,
                "memory_stats": lambda device=None: {"num_alloc_retries": 2, "num_ooms": 1},
                "reset_peak_memory_stats": lambda device=None: setattr(self, "resets", self.resets + 1),
                "mem_get_info": lambda device=None: (30 * self.GiB, 80 * self.GiB)}
        for name, fn in fake.items():
            monkeypatch.setattr(torch.cuda, name, fn)


GPU = torch.device("cuda", 0)  # a device object only: nothing is allocated on it


def test_memory_figures_read_the_cuda_allocator(monkeypatch):
    from shardbench.trainer import exporter, metrics

    alloc = FakeAllocator(monkeypatch)
    assert metrics.end_setup_memory(GPU) == 4 * alloc.GiB and alloc.resets == 1  # training's peak alone
    mem = metrics.rank_memory(0, GPU, setup_peak=7)
    assert (mem.setup_peak_bytes, mem.train_peak_bytes, mem.train_reserved_peak_bytes) == (7, 4 * alloc.GiB,
                                                                                         6 * alloc.GiB)
    assert (mem.num_alloc_retries, mem.num_ooms) == (2, 1)
    assert exporter._memory(GPU) == {"allocated": 3 * alloc.GiB, "reserved": 5 * alloc.GiB,
                                     "peak_allocated": 4 * alloc.GiB}
    assert exporter._memory(torch.device("cpu")) == {}


def test_the_exporter_reads_nvml_utilisation_as_a_ratio_and_temperature_in_celsius(monkeypatch):
    """The CUDA branch of the exporter's GPU gauges (`_gpu`): NVML's percent becomes a 0-1 ratio,
    the temperature stays in degrees celsius; a CPU device exports neither."""
    from shardbench.trainer import exporter

    monkeypatch.setattr(torch.cuda, "utilization", lambda device=None: 87)
    monkeypatch.setattr(torch.cuda, "temperature", lambda device=None: 71)
    collector = exporter.Collector.__new__(exporter.Collector)

    def read(device):
        collector.ex = SimpleNamespace(device=device)
        return {name: value for name, _doc, value in collector._gpu(lambda *a: a[:3])}

    assert read(GPU) == {"shardbench_gpu_utilization_ratio": 0.87, "shardbench_gpu_temperature_celsius": 71}
    assert read(torch.device("cpu")) == {}


def test_preflight_caps_its_sweep_at_a_third_of_free_gpu_memory(monkeypatch):
    alloc = FakeAllocator(monkeypatch)
    assert preflight.memory_cap(GPU, local_size=8) == 10 * alloc.GiB  # per GPU: not shared like host RAM
    args = preflight.parse(["--min-size-mib", "1", "--max-size-mib", "65536"])
    assert preflight.sweep_sizes(args, preflight.memory_cap(GPU, 8))[-1] == 8192


def test_a_gpu_rank_joins_nccl_with_its_timer_on(monkeypatch):
    """The counter's seconds need NCCL's per-work timer, read when the group is made: the
    variable is set before init_process_group, which is asked for NCCL on the rank's device."""
    import os

    from shardbench.trainer import process
    from shardbench.trainer.config import RunConfig
    from shardbench.trainer.dist_env import DistEnv

    seen = {}
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING", raising=False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: seen.setdefault("device", device))
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(
        backend=backend, timing=os.environ.get("TORCH_NCCL_ENABLE_TIMING")))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # restored after the test
    from torch.distributed import distributed_c10d as c10d
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):  # the function sets them
        monkeypatch.setattr(c10d, name, getattr(c10d, name))
    denv = DistEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, master_addr="127.0.0.1",
                   master_port=29500, launcher="torchrun")
    assert process.init_process_group(RunConfig(strategy="fsdp"), denv, torch.device("cuda", 1)) is True
    assert seen == {"device": torch.device("cuda", 1), "backend": "nccl", "timing": "1"}
