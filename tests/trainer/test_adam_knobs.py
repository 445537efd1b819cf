"""AdamW's betas and epsilon are RunConfig knobs (`--adam-beta1/--adam-beta2/--adam-eps`), bounded
above by `knob(below=1)`: the optimizer every strategy builds takes them (they were literals in
three files, so a changed beta was trained with but recorded as 0.95), the trainer's rules, the
matrix and the dry run refuse values out of bounds in one line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from shardbench.trainer import rules
from shardbench.trainer.config import RunConfig, parse_args
from shardbench.trainer.dist_env import DistEnv
from shardbench.trainer.strategies.base import Context, make_adamw
from shardbench.suite.matrix.expand import expand, matrix_from_dict

ROOT = Path(__file__).resolve().parents[2]


def test_the_optimizer_takes_betas_and_eps_from_the_config():
    cfg = parse_args(["--strategy", "ddp", "--adam-beta1", "0.8", "--adam-beta2", "0.99", "--adam-eps", "1e-6"])
    ctx = Context(cfg, DistEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, launcher="none",
                          master_addr=None, master_port=None),
                  torch.device("cpu"), "fp32", 1, False)
    opt = make_adamw([{"params": [torch.nn.Parameter(torch.zeros(2))]}], ctx)
    assert opt.defaults["betas"] == (0.8, 0.99) and opt.defaults["eps"] == 1e-6


def test_bounds_above_are_rules_with_one_wording_each():
    assert rules.validate(RunConfig(strategy="ddp", adam_beta2=1.0), 1) == ["--adam-beta2 must be below 1, got 1.0"]
    assert rules.validate(RunConfig(strategy="ddp", adam_eps=0.0), 1) == ["--adam-eps must be above 0, got 0.0"]
    assert rules.validate(RunConfig(strategy="ddp", adam_beta1=0.0, adam_beta2=0.999), 1) == []
    _, errors = expand(matrix_from_dict({"strategies": ["ddp"], "world_sizes": [1], "adam_beta1": [0.9, 1.5]}))
    assert errors == ["adam_beta1 must be below 1, got 1.5"]


def test_the_dry_run_refuses_a_beta_of_1_in_one_line():
    out = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--dry-run", "--strategies", "ddp",
                          "--world-sizes", "1", "--repeats", "1", "--adam-beta2", "1"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "shardbench: invalid matrix: adam_beta2 must be below 1, got 1"], out.stderr
