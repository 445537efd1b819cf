"""Issue 18, finding 4: the loss check compares the gradient norm of every step too.

Real runs: DDP whose all-reduce sums instead of averaging (the bug, injected by a wrapper script
that replaces DDPStrategy.comm_hook before the trainer starts; nothing in the trainer knows)
doubles the gradient at 2 ranks. Adam divides the scale away (and clipping at 1.0 too), so its
loss stays within ~1e-7 of the reference and the loss alone passes; its gradient norm is 2x."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainer.conftest import BIN, REPO, Run, cpu_env, free_port, run_trainer
from shardbench.suite import analysis

COMMON = ["--model", "tiny", "--seq-len", "64", "--global-batch", "4", "--steps", "4", "--warmup-steps", "1",
          "--precision", "fp32", "--lr", "1e-3", "--lr-warmup-steps", "1"]

SUMMING_DDP = '''
import sys
import torch.distributed as dist
from shardbench.trainer.strategies import ddp

def sum_hook(group, bucket):  # the bug: all-reduce without dividing by the world size
    return dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future().then(lambda f: f.value()[0])

ddp.DDPStrategy.comm_hook = lambda self: sum_hook
from shardbench.trainer.cli import main
sys.exit(main())
'''


@pytest.mark.slow
def test_ddp_summing_gradients_is_caught_by_the_gradient_norm(tmp_path: Path):
    script = tmp_path / "summing_ddp.py"
    script.write_text(SUMMING_DDP)
    buggy = subprocess.run([str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
                            str(script), "--strategy", "ddp", "--micro-batch", "2", "--run-id", "ddp-summing-r0", *COMMON],
                           cwd=REPO, env=dict(cpu_env(), PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=300)
    assert buggy.returncode == 0, buggy.stderr[-3000:]
    one = run_trainer(["--strategy", "ddp", "--micro-batch", "4", "--run-id", "ddp-w1-r0", *COMMON], tmp_path)
    fsdp = run_trainer(["--strategy", "fsdp", "--micro-batch", "2", "--run-id", "fsdp-w2-r0", *COMMON], tmp_path,
                       launcher="torchrun", nproc=2)
    assert one.returncode == 0 and fsdp.returncode == 0, one.stderr[-2000:] + fsdp.stderr[-2000:]
    records = [Run(0, buggy.stdout, "").record, one.record, fsdp.record]
    summed, good = records[0]["grad_norm_per_step"], records[2]["grad_norm_per_step"]
    assert summed[0] == pytest.approx(2 * good[0], rel=1e-3)
    an = analysis.analyze(records)
    runs = an.runs.set_index("run_id")
    assert runs.loc["ddp-summing-r0", "loss_max_rel_diff"] < 1e-4  # the loss alone cannot see it
    assert runs.loc["ddp-summing-r0", "loss_check"] == "broken"
    assert runs.loc["ddp-w1-r0", "loss_check"] == runs.loc["fsdp-w2-r0", "loss_check"] == "ok"
    (group,) = an.loss_groups
    assert [rid for rid, _ in group.broken] == ["ddp-summing-r0"] and "gradient norm" in group.broken[0][1]
