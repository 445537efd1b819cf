"""Small pure pieces of the trainer: launch-environment detection, the token stream, memory
counting, MFU's FLOPs and peak table, collective counting, what the step timer covers."""
from __future__ import annotations

import os

import pytest
import torch

from shardbench.trainer import data as trainer_data
from shardbench.trainer.comm import CommCounter
from tests.trainer.conftest import flag_timed_window
from shardbench.trainer.config import parse_args
from shardbench.trainer.data import SyntheticBatches
from shardbench.trainer.dist_env import detect
from shardbench.trainer.metrics import StorageCounter, peak_flops_for
from shardbench.trainer.model import PRESETS, TinyGPT, count_params, flops_params, flops_per_token


@pytest.mark.parametrize("env,expected", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
      "TORCHELASTIC_RUN_ID": "x", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"},
     (3, 8, 1, 2, "torchrun", "10.0.0.1", 29500)),
    ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16", "OMPI_COMM_WORLD_LOCAL_RANK": "5",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, (5, 16, 5, 8, "mpirun", None, None)),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
     (2, 4, 0, 1, "mpirun", None, None)),
    ({}, (0, 1, 0, 1, "none", None, None)),
])
def test_launch_environment_detection(env, expected):
    d = detect(env)
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size, d.launcher, d.master_addr, d.master_port) == expected


def test_every_world_size_sees_the_same_global_batch():
    def rows(world, micro, accum):
        out = []
        for rank in range(world):
            batches = SyntheticBatches(7, 16, 1000, micro, accum, rank, world).step_batches(3)
            out += [(m, rank, x) for m, (x, _) in enumerate(batches)]
        # reassemble in the documented order: row block (micro * world + rank)
        out.sort(key=lambda t: t[0] * world + t[1])
        return torch.cat([x for _, _, x in out])

    single = rows(1, 8, 1)
    assert torch.equal(rows(2, 2, 2), single)
    assert torch.equal(rows(4, 1, 2), single)
    assert torch.equal(rows(8, 1, 1), single)
    assert not torch.equal(SyntheticBatches(7, 16, 1000, 8, 1, 0, 1).step_batches(4)[0][0], single)


def test_each_rank_generates_only_its_own_rows(monkeypatch):
    """Generation cost must not grow with the world size: rank 5 of 64 makes its 2 x 3 rows,
    not the 384 of the global batch."""
    made = []
    real = trainer_data.row_tokens
    monkeypatch.setattr(trainer_data, "row_tokens", lambda *a: made.append(a[2]) or real(*a))
    batches = SyntheticBatches(7, 16, 1000, 2, 3, 5, 64).step_batches(0)
    assert sorted(made) == [(m * 64 + 5) * 2 + i for m in range(3) for i in range(2)]
    assert [x.shape for x, _ in batches] == [torch.Size([2, 16])] * 3


def test_storage_counter_counts_each_byte_once():
    c = StorageCounter()
    flat = torch.zeros(100)
    assert c.add([flat[:10], flat[5:20], flat]) == 400
    assert c.add([flat[50:]]) == 0
    assert c.add([torch.zeros(3)]) == 12


def test_flops_convention_and_peak_table():
    cfg = PRESETS["gpt2-124m"]
    assert flops_params(cfg) + cfg.block_size * cfg.n_embd == 125_226_240  # all params at block 2048
    assert flops_per_token(cfg, 1024) == 6 * flops_params(cfg) + 12 * 12 * 768 * 1024
    tiny = PRESETS["tiny"]
    assert count_params(TinyGPT(tiny)) == flops_params(tiny) + tiny.block_size * tiny.n_embd


@pytest.mark.parametrize("name,precision,tflops", [
    ("NVIDIA A10", "bf16", 125), ("NVIDIA A10G", "bf16", 70), ("NVIDIA A100-SXM4-80GB", "bf16", 312),
    ("NVIDIA H100 80GB HBM3", "bf16", 989), ("NVIDIA H100 PCIe", "bf16", 756), ("NVIDIA H100 NVL", "bf16", 835),
    ("NVIDIA H200", "bf16", 989), ("NVIDIA GH200 480GB", "bf16", 989), ("NVIDIA L40", "bf16", 181),
    ("NVIDIA L40S", "bf16", 362), ("NVIDIA L4", "bf16", 121),
    # fp32 runs are divided by an fp32 peak: CUDA cores with TF32 off (torch's default)
    ("NVIDIA H100 80GB HBM3", "fp32", 67), ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
])
def test_device_peak_table(name, precision, tflops):
    peak = peak_flops_for(name, precision, None)
    assert peak.flops == tflops * 1e12 and peak.warning is None, peak.source


def test_tf32_peak_when_tf32_is_on():
    assert peak_flops_for("NVIDIA H100 80GB HBM3", "fp32", None, tf32=True).flops == 495e12


def test_detected_device_wins_over_the_shapes_peak_with_a_warning():
    """values/h100.yaml (989) on an H100 PCIe: MFU uses 756 and says so."""
    peak = peak_flops_for("NVIDIA H100 PCIe", "bf16", 989.0)
    assert peak.flops == 756e12 and peak.given == 989e12
    assert "989" in peak.warning and "756" in peak.warning
    assert peak_flops_for("NVIDIA H100 80GB HBM3", "bf16", 989.0).warning is None


def test_shapes_peak_used_only_for_an_unknown_device():
    assert peak_flops_for("AMD EPYC", "fp32", None).flops is None
    assert peak_flops_for("", "fp32", 100.0).flops == 100e12
    assert peak_flops_for("Some Future GPU", "bf16", 500.0).flops == 500e12


def test_comm_counter_counts_the_outermost_call_per_operation():
    counter = CommCounter()
    inner = counter._wrap(lambda tensor: None, "all_reduce", 0, "tensor", None)
    outer = counter._wrap(lambda objs: [inner(torch.zeros(3)), inner(torch.zeros(5))], "all_gather", 0, "x", None)
    outer([torch.zeros(2, dtype=torch.float64)])
    assert counter.calls == {}  # not active: nothing counted
    counter.active = True
    outer([torch.zeros(2, dtype=torch.float64)])
    inner(tensor=torch.zeros(4, dtype=torch.bfloat16))
    per_step = counter.per_step(2)
    assert {op: (v["calls"], v["bytes"]) for op, v in per_step.items()} == {"all_gather": (0.5, 8.0),
                                                                          "all_reduce": (0.5, 4.0)}
    # Synchronous calls: each op was in flight for some time (the outer one around the inner).
    assert all(v["seconds"] > 0 for v in per_step.values())
    assert counter._in_flight == {"all_gather": (0, counter._in_flight["all_gather"][1]),
                                  "all_reduce": (0, counter._in_flight["all_reduce"][1])}


@pytest.fixture
def restore_cpu():
    """The in-process trainer pins this process and sets its threads: undo both afterwards so
    that later tests' ranks (which inherit the affinity) see every core."""
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    yield
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)


def test_only_the_step_is_inside_the_timed_window(restore_cpu):
    """Token generation and model-state sampling never run while a step is timed; the model
    state is sampled after every micro-step's backward and after the update of one extra step."""
    from shardbench.trainer.train import Trainer

    cfg = parse_args(["--strategy", "ddp", "--seq-len", "16", "--micro-batch", "2", "--grad-accum", "3",
                      "--steps", "3", "--warmup-steps", "1", "--precision", "fp32", "--device", "cpu"])
    t = Trainer(cfg, detect({}))
    t.init_process_group()
    t.build()
    timing, inside = flag_timed_window(t), []
    batches, state = t.data.step_batches, t.strategy.model_state
    t.data.step_batches = lambda step: inside.append(("data", timing[0])) or batches(step)
    t.strategy.model_state = lambda: inside.append(("state", timing[0])) or state()
    t.train(0.0)
    assert all(not during for _, during in inside), inside
    assert [kind for kind, _ in inside].count("state") == 3 + 1
    assert [kind for kind, _ in inside].count("data") == 3 + 1  # steps, and the memory step's
    assert t.state.peak_at.startswith("micro-step") and len(t.history.step_times) == 2
