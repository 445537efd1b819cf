"""A new strategy is a row of trainer.contract.STRATEGIES plus its implementation (dispatched by
engine): with a throwaway row `ddpcopy` (a copy of ddp's, so ddp's implementation runs it) added
before anything else imports the contract, every strategy-parametrised test that runs ddp also
runs ddpcopy, and the trainer trains it and records it. Nothing else is edited."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ORIGINAL = {"ddp", "fsdp", "zero1", "zero2", "zero3"}
PLUGIN = '''
import dataclasses
from shardbench.trainer import contract
contract.STRATEGIES["ddpcopy"] = dataclasses.replace(contract.STRATEGIES["ddp"], name="ddpcopy",
                                                     summary="a throwaway copy of ddp (test_strategy_flow.py)")
contract.STRATEGIES["zero2host"] = dataclasses.replace(contract.STRATEGIES["zero2"], name="zero2host",
                                                       on_host=("optimizer",),
                                                       summary="a throwaway ZeRO-2 with its optimizer on the host")
'''
"""Two throwaway rows: a copy of ddp, and issue 27's layout row (ZeRO-2 with its optimizer on the
host: a preset of the declaration that no implementation names)."""


# Parametrised by strategy names on purpose, each for its reason: samples, not the table.
SAMPLES = {
    "tests/trainer/test_layouts.py::test_every_strategy_trains_to_the_fused_models_numbers":
        "numbers recorded from the fused-qkv model, for the strategies that existed then",
    "tests/trainer/test_plan_layouts.py::test_a_row_with_a_known_layout_is_planned_as_its_layout":
        "adds its own copies of two rows and compares them with their originals",
    "tests/suite/test_config_ids.py::test_a_new_knob_at_its_default_keeps_every_existing_id":
        "three sample configurations whose ids must not move",
}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    plugin_dir = tmp_path_factory.mktemp("plugin")
    (plugin_dir / "sb_new_strategy.py").write_text(PLUGIN)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), str(REPO)]),
            "PYTHONWARNINGS": "ignore::FutureWarning"}


@pytest.mark.slow  # collects three test folders in a subprocess (~20 s)
def test_every_strategy_parametrised_test_runs_the_new_row(env):
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "sb_new_strategy",
                           "-p", "no:cacheprovider", "tests/trainer", "tests/suite", "tests/chart"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids: dict[str, set[str]] = defaultdict(set)
    for line in proc.stdout.splitlines():
        m = re.match(r"^(\S+::\S+?)\[(.*)\]$", line.strip())
        if m:
            ids[m.group(1)].add(m.group(2))
    # Parametrised over the strategies: an id that is a strategy alone, or every strategy in some
    # combination (chart renders of strategy x launcher). Hand-picked pairs (a strategy with the
    # damage, launcher or collective it is checked with) are samples, not the table.
    def tokens(test):
        return {t for i in ids[test] for t in re.split(r"-", i)}
    over_strategies = [t for t in ids if "ddp" in ids[t] or ORIGINAL <= tokens(t)]
    assert len(over_strategies) >= 10, over_strategies  # strategy runs, checkpoints, faults, chart
    # each throwaway row runs wherever the row it copies runs (a test may pick rows by attribute)
    for row, copied in (("ddpcopy", "ddp"), ("zero2host", "zero2")):
        missing = [t for t in over_strategies if copied in tokens(t) and row not in tokens(t) and t not in SAMPLES]
        assert missing == [], f"parametrised over strategies but not from the contract's table: {missing}"


@pytest.mark.slow
def test_the_trainer_trains_the_new_row(env, tmp_path):
    code = ("import sb_new_strategy, sys; from shardbench.trainer.cli import main; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", code, "--strategy", "ddpcopy", "--seq-len", "16", "--steps", "3",
                          "--warmup-steps", "1", "--device", "cpu", "--output-dir", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["status"] == "ok" and record["strategy"] == "ddpcopy" and record["run_id"].startswith("ddpcopy-w1-")


@pytest.mark.slow
def test_the_trainer_trains_the_offload_row_and_reports_where_its_memory_lives(env, tmp_path):
    code = ("import sb_new_strategy, sys; from shardbench.trainer.cli import main; sys.exit(main(sys.argv[1:]))")
    run = subprocess.run([sys.executable, "-c", code, "--strategy", "zero2host", "--seq-len", "16", "--steps", "3",
                          "--warmup-steps", "1", "--device", "cpu", "--output-dir", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    record = json.loads((tmp_path / "result.json").read_text())
    assert record["status"] == "ok" and record["strategy"] == "zero2host"
    state = record["model_state"][0]
    # optimizer (fp32 master + moments) and its fp32 gradient partition on the host, weights on the device
    assert state["host_bytes"] == state["optimizer_bytes"] + state["master_bytes"] + state["grads_bytes"] > 0
    assert state["device_bytes"] == state["total_bytes"] - state["host_bytes"]
    # and it is planned: the same split, predicted
    plan = subprocess.run([sys.executable, "-c", "import sb_new_strategy, json; from shardbench.trainer.plan.predict "
                           "import predict; from shardbench.trainer.plan.inputs import PlanInput; "
                           "print(json.dumps(predict(PlanInput('zero2host', seq_len=16))['memory_by_location']))"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert json.loads(plan.stdout.splitlines()[-1])["host"] == state["host_bytes"]
