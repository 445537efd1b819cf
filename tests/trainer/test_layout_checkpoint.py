"""Checkpoints of mesh layouts (issue 28): DCP saves the DTensor shards of tp, fsdp+tp and HSDP,
and a run resumed from step 3 trains steps 4-6 to exactly the losses and gradient norms of the
uninterrupted run that saved it. DDP + TP (local shards DCP would take for replicated tensors)
is refused in one line."""
from __future__ import annotations

import pytest

from tests.trainer.conftest import run_trainer
from shardbench.trainer.config import RunConfig

COMMON = ["--model", "tiny", "--seq-len", "64", "--global-batch", "8", "--warmup-steps", "1", "--precision", "fp32",
          "--seed", "7"]


@pytest.mark.slow
@pytest.mark.parametrize("ranks, flags", [(2, ["--strategy", "ddp", "--tp", "2", "--micro-batch", "4"]),
                                          (4, ["--strategy", "fsdp", "--tp", "2", "--micro-batch", "2"]),
                                          (2, ["--strategy", "fsdp", "--dp-replicate", "2", "--micro-batch", "2"])],
                         ids=["tp-2", "fsdp+tp-2x2", "hsdp-2"])
def test_a_tp_run_resumes_to_the_uninterrupted_numbers(tmp_path, ranks, flags):
    """The first run saves at step 3 (not at its last step) and trains on to 6; the second
    resumes from that checkpoint and trains steps 4-6 again."""
    args = [*COMMON, *flags, "--steps", "6", "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "3"]
    whole = run_trainer(args, tmp_path, launcher="torchrun", nproc=ranks)
    assert whole.returncode == 0, whole.stderr[-3000:]
    again = run_trainer(args, tmp_path, launcher="torchrun", nproc=ranks)
    assert again.returncode == 0, again.stderr[-3000:]
    r, w = again.record, whole.record
    assert r["checkpoint"]["resumed_from_step"] == 3, r["checkpoint"]
    assert r["loss_per_step"][3:] == w["loss_per_step"][3:]
    assert r["grad_norm_per_step"][3:] == w["grad_norm_per_step"][3:]


def test_ddp_tp_checkpointing_is_one_line():
    from shardbench.trainer import rules

    errors = rules.validate(RunConfig(strategy="ddp", tp=2, checkpoint_dir="/tmp/x", checkpoint_every=2), 4)
    assert errors == ["--tp 2 with ddp over 2 data-parallel ranks does not checkpoint yet: use fsdp (fsdp+tp "
                      "checkpoints), or drop --checkpoint-every / --async-checkpoint"]
    assert rules.validate(RunConfig(strategy="ddp", tp=2, checkpoint_dir="/tmp/x", checkpoint_every=2), 2) == []
    assert rules.validate(RunConfig(strategy="fsdp", tp=2, checkpoint_dir="/tmp/x", checkpoint_every=2), 4) == []
