"""Small pure pieces of the trainer: launch-environment detection, the token stream, memory
counting, MFU's FLOPs and peak table."""
from __future__ import annotations

import pytest
import torch

from trainer.data import SyntheticBatches
from trainer.dist_env import detect
from trainer.metrics import StorageCounter, peak_flops_for
from trainer.model import PRESETS, TinyGPT, count_params, flops_params, flops_per_token


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
    assert not torch.equal(SyntheticBatches(7, 16, 1000, 8, 1, 0, 1).step_batches(4)[0][0], single)


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
    assert peak_flops_for("NVIDIA A10", None)[0] == 125e12
    assert peak_flops_for("NVIDIA A100-SXM4-80GB", None)[0] == 312e12
    assert peak_flops_for("NVIDIA H100 80GB HBM3", None)[0] == 989e12
    assert peak_flops_for("NVIDIA H200", None)[0] == 989e12
    assert peak_flops_for("AMD EPYC", None) == (None, None)
    assert peak_flops_for("AMD EPYC", 100.0)[0] == 100e12
