"""The tests' fork server (tests/forkserver.py) runs the trainer as a fresh interpreter does, and
its forked ranks as torchrun's do: the same record numbers, the same collectives counted
(DeepSpeed imported after the trainer wrapped torch.distributed, as in a real rank), the same
placement, exit codes and one-line errors."""
from __future__ import annotations

import pytest

from tests.trainer.conftest import run_trainer

pytestmark = pytest.mark.slow  # a one-rank run twice

ARGS = ["--strategy", "zero2", "--model", "tiny", "--seq-len", "32", "--micro-batch", "2", "--global-batch", "4",
        "--steps", "3", "--warmup-steps", "1", "--precision", "fp32", "--seed", "3"]


@pytest.mark.parametrize("strategy,nproc", [("zero2", 1), ("fsdp", 2), ("zero3", 2)])
def test_a_forked_run_is_a_fresh_interpreters_run(tmp_path, strategy, nproc):
    """One rank against a fresh `python -m shardbench.trainer`; two against real torchrun."""
    args, launcher = ["--strategy", strategy, *ARGS[2:]], "torchrun" if nproc > 1 else None
    forked = run_trainer(args, tmp_path, launcher=launcher, nproc=nproc)
    fresh = run_trainer(args, tmp_path, launcher=launcher, nproc=nproc, fork=False)
    assert forked.forked and not fresh.forked
    assert forked.returncode == fresh.returncode == 0, forked.stderr[-2000:] + fresh.stderr[-2000:]
    a, b = forked.record, fresh.record
    assert a["loss_per_step"] == b["loss_per_step"] and a["grad_norm_per_step"] == b["grad_norm_per_step"]
    assert a["comm_per_step"] and {op: (c["calls"], c["bytes"]) for op, c in a["comm_per_step"].items()} == \
        {op: (c["calls"], c["bytes"]) for op, c in b["comm_per_step"].items()}
    assert a["model_state"] == b["model_state"] and a["threads_per_rank"] == b["threads_per_rank"]
    assert a["cpu_affinity"] == b["cpu_affinity"] and a["launcher"] == b["launcher"]
    assert a["world_size"] == b["world_size"] == nproc and a["mesh_coords"] == b["mesh_coords"]


def test_a_refused_run_exits_2_with_one_line_in_both(tmp_path):
    forked = run_trainer(["--strategy", "ddp", "--checkpoint-every", "5"], tmp_path)
    fresh = run_trainer(["--strategy", "ddp", "--checkpoint-every", "5"], tmp_path, fork=False)
    assert forked.returncode == fresh.returncode == 2
    assert forked.stderr == fresh.stderr and len(forked.stderr.strip().splitlines()) == 1
