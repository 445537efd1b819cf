"""The run contract (trainer/contract.py) and the command line generated from RunConfig."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from shardbench.trainer import contract, rules
from shardbench.trainer.config import RunConfig, build_parser, parse_args, to_argv
from shardbench.trainer.fielddocs import field_docs
from shardbench.trainer.presets import PRESETS


def test_every_knob_is_a_documented_flag_with_its_default():
    helps = {a.dest: a for a in build_parser()._actions}
    docs = field_docs(RunConfig)
    for f in fields(RunConfig):
        if f.name == "argv":
            continue
        assert f.name in helps, f"{f.name} has no flag"
        assert docs.get(f.name), f"{f.name} has no docstring"
        assert docs[f.name] in helps[f.name].help.replace("%%", "%")
        if f.default not in (None, False) and f.name != "strategy":
            assert f"(default: {f.default})" in helps[f.name].help


def test_choices_come_from_the_tables():
    actions = {a.dest: a for a in build_parser()._actions}
    assert tuple(actions["strategy"].choices) == tuple(contract.STRATEGIES)
    assert tuple(actions["model"].choices) == tuple(PRESETS)
    assert tuple(actions["precision"].choices) == contract.PRECISIONS
    assert tuple(actions["device"].choices) == contract.DEVICES


def test_to_argv_is_the_inverse_of_parse_args():
    cfg = RunConfig(strategy="zero2", model="gpt2-124m", seq_len=512, lr=3e-4, compile=True,
                    activation_checkpointing=False, global_batch=16, repeat=2)
    names = [f.name for f in fields(RunConfig) if f.name != "argv"]
    back = parse_args(to_argv(cfg, names))
    assert [getattr(back, n) for n in names] == [getattr(cfg, n) for n in names]


def test_run_ids_round_trip_and_differ_by_config():
    a = contract.config_id({"strategy": "ddp", "lr": 1e-4})
    b = contract.config_id({"strategy": "ddp", "lr": 2e-4})
    assert a != b and len(a) == contract.CONFIG_ID_LEN
    rid = contract.run_id("zero3", 4, 2048, 1, 4, a, 2)
    assert rid == f"zero3-w4-s2048-mb1-ga4-{a}-r2"  # readable prefix, the config id, the repeat


@pytest.mark.parametrize("name", list(contract.STRATEGIES))
def test_every_strategy_is_complete_data(name):
    info = contract.STRATEGIES[name]
    assert info.default_launcher in contract.CLUSTER_LAUNCHERS
    assert info.engine in ("ddp", "fsdp", "deepspeed")
    assert contract.is_deepspeed(name) == (info.engine == "deepspeed") == info.group_at_world_size_1
    # Sharding never costs memory: N ranks hold at most what one holds.
    for precision in ("fp32", "bf16"):
        assert info.model_state_bytes_per_param(precision, 8) <= info.model_state_bytes_per_param(precision, 1)


def test_model_state_estimate_refuses_what_cannot_fit():
    cfg = RunConfig(strategy="ddp", model="llama-7b-shape", device="cpu")
    assert rules.check_fits(cfg, 1, 1, 24 * 2 ** 30, "this host").startswith(
        "llama-7b-shape under ddp needs about ")
    assert rules.check_fits(RunConfig(strategy="ddp"), 1, 2, 24 * 2 ** 30, "this host") is None


def test_validate_collects_every_type_problem_in_one_pass():
    cfg = RunConfig(strategy="ddp", seed="abc", steps=0, lr=float("nan"))  # type: ignore[arg-type]
    assert rules.validate(cfg, 1) == ["--steps must be at least 1, got 0",
                                         "--seed must be an integer, got 'abc'",
                                         "--lr must be a finite number, got nan"]
    assert rules.validate(RunConfig(strategy="ddp"), 0) == ["world size must be a positive integer, got 0"]


def test_trainer_help_lists_every_flag_without_torch():
    code = ("import sys; from shardbench.trainer.config import build_parser; build_parser().format_help(); "
            "import shardbench.trainer.contract; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_contract_reads_no_run_config():
    """One way only: rules -> config -> contract. contract.py once took `cfg: Any` and read
    RunConfig's fields while config.py imported it (two modules claiming to be the contract)."""
    import inspect

    for name, fn in inspect.getmembers(contract, inspect.isfunction):
        if fn.__module__ == contract.__name__:
            assert "cfg" not in inspect.signature(fn).parameters, f"contract.{name} reads a RunConfig"
    code = subprocess.run([sys.executable, "-c", "import sys, shardbench.trainer.contract; "
                           "print(sorted(m for m in sys.modules if m.startswith('shardbench.trainer.')))"],
                          capture_output=True, text=True, check=True).stdout
    assert "shardbench.trainer.config" not in code and "shardbench.trainer.rules" not in code
