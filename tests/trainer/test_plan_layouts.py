"""The planner dispatches on a strategy's layout (trainer/contract.py StateLayout: engine, ZeRO
stage, which state is sharded, where it lives), never on its name: a throwaway row with a known
layout is planned exactly as the row it copies, a throwaway ZeRO-2 with its optimizer on the host
is planned as `--offload optimizer` is, memory by location, and a layout it has no model of (an
FSDP engine that shards only the optimizer) is one line "not modelled: <why>" in `shardbench
plan`, in `shardbench run`'s plan and in the report: never a traceback, never a silent drop."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardbench.trainer import contract
from shardbench.trainer.plan.inputs import Params, PlanInput
from shardbench.trainer.plan.planned_layout import NotModelled

REPO = Path(__file__).resolve().parents[2]
OFFLOAD_ROW = '''
import dataclasses
from shardbench.trainer import contract
contract.STRATEGIES["fsdp-partial"] = dataclasses.replace(
    contract.STRATEGIES["fsdp"], name="fsdp-partial", sharded=("optimizer",),
    summary="a throwaway FSDP engine sharding only the optimizer, which the planner has no model of")
'''
"""A layout without a model (the module name is older than the row)."""
NAMES = "|".join(re.escape(s) for s in ("ddp", "fsdp", "zero1", "zero2", "zero3", "zero"))
# A name compared with == / != / in: allowed only where the left side is an engine (a layout
# attribute, or what a trace runs), never a strategy's name.
COMPARED = re.compile(rf'(\S+)\s*(?:==|!=|\bin|\bnot in)\s*[\(\[]?\s*"({NAMES})"')
STARTS = re.compile(rf'startswith\(\s*"({NAMES})"')
# The planner, the memory model (the contract's bytes by location, the counted state, the fit
# check) and the verdict code (suite/analyze: its columns, groupings and verdicts; the summary).
NAME_FREE = ["trainer/plan/*.py", "trainer/contract.py", "trainer/metrics.py", "trainer/rules.py",
             "suite/analyze/verdicts.py", "suite/analyze/columns.py", "suite/analyze/rows.py",
             "suite/analyze/groups.py", "suite/report/summary.py"]


def strategy_name_tests(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if STARTS.search(line)
            or any(not m.group(1).rstrip(")").endswith("engine") for m in COMPARED.finditer(line))]


@pytest.fixture
def copies(monkeypatch):
    """ddpcopy, fsdpcopy: rows with the layouts of ddp and fsdp under names the planner never saw."""
    for name in ("ddp", "fsdp"):
        monkeypatch.setitem(contract.STRATEGIES, f"{name}copy",
                            dataclasses.replace(contract.STRATEGIES[name], name=f"{name}copy"))


def test_the_grep_finds_every_form_of_a_strategy_name_test():
    said = ['if r.get("strategy") == "fsdp" else 1', 'if name.startswith("zero"):', 'if s in ("ddp", "fsdp"):',
            'stage = 3 if inp.strategy == "zero3" else 0', 'if strategy != "ddp":']
    fine = ['if info.engine == "ddp":', 'return STRATEGIES[s].engine == "fsdp"', 'if engine not in ("ddp", "fsdp"):']
    assert strategy_name_tests(said) == said and strategy_name_tests(fine) == []


def test_the_planner_memory_model_and_verdicts_have_no_strategy_name_test():
    """No `== "zero3"`, `startswith("zero")` or `in ("ddp", ...)` in the planner, the memory model or
    the verdict code: they read the layout's attributes (engine, stage, sharded, on_host)."""
    paths = sorted({p for pattern in NAME_FREE for p in REPO.glob(pattern)})
    assert len(paths) >= 12  # the planner's modules and the memory model at least
    hits = [f"{p.relative_to(REPO)}: {line}" for p in paths for line in strategy_name_tests(p.read_text().splitlines())]
    assert hits == []


@pytest.mark.parametrize("original", ["ddp", "fsdp"])
def test_a_row_with_a_known_layout_is_planned_as_its_layout(copies, original):
    from shardbench.trainer.plan.predict import predict

    for world in (1, 2):
        a = predict(PlanInput(strategy=original, world_size=world, grad_accum=2))
        b = predict(PlanInput(strategy=f"{original}copy", world_size=world, grad_accum=2))
        assert (b["memory"], b["comm_per_step"], b["method"]) == (a["memory"], a["comm_per_step"], a["method"])


def test_a_layout_without_a_model_is_refused_with_its_reason(monkeypatch):
    from shardbench.trainer.plan.predict import predict

    monkeypatch.setitem(contract.STRATEGIES, "fsdp-partial", dataclasses.replace(
        contract.STRATEGIES["fsdp"], name="fsdp-partial", sharded=("optimizer",)))
    with pytest.raises(NotModelled, match="an FSDP engine with params, grads, optimizer not all sharded"):
        predict(PlanInput(strategy="fsdp-partial", world_size=2))


def test_an_offload_row_is_planned_by_where_its_state_lives(monkeypatch):
    """Issue 27's throwaway row (ZeRO-2, optimizer on the host) is planned as zero2 --offload
    optimizer, its optimizer state and fp32 gradient partition predicted in host memory."""
    from shardbench.trainer.plan.predict import predict

    monkeypatch.setitem(contract.STRATEGIES, "zero2-offload", dataclasses.replace(
        contract.STRATEGIES["zero2"], name="zero2-offload", on_host=("optimizer",)))
    row = predict(PlanInput(strategy="zero2-offload", world_size=2))
    knob = predict(PlanInput(strategy="zero2", world_size=2, offload="optimizer"))
    plain = predict(PlanInput(strategy="zero2", world_size=2))
    assert row["memory_by_location"] == knob["memory_by_location"]
    P = Params.of(PlanInput("zero2").model_config()).total
    part = -(-P // 2)
    assert knob["memory_by_location"]["host"] == (4 + 4 + 8) * part  # fp32 grads, master, moments
    assert plain["memory_by_location"]["host"] == 0
    assert sum(knob["memory_by_location"].values()) == knob["peak_bytes"]


SCRIPT = '''
import json, sys
import sb_offload_row  # the throwaway row, before anything reads the table
from shardbench.suite.cli.commands import main
from shardbench.suite.matrix.expand import MatrixSpec, expand
from shardbench.suite.matrix.planning import plan_lines, predict_specs, unplanned
from shardbench.suite.report.plan_section import markdown

print("EXIT", main(["plan", "--strategy", "fsdp-partial,zero2", "--world-size", "2"]))
specs, errors = expand(MatrixSpec(strategies=["fsdp-partial", "zero2"], world_sizes=[2], steps=3, warmup_steps=1))
assert not errors, errors
predictions, why = predict_specs(specs)
print("WHY", why)
print("UNPLANNED", json.dumps(unplanned(specs, predictions)))
print("PANEL", json.dumps(plan_lines(specs, predictions)))
record = {"run_id": specs[0].run_id, "status": "ok", "prediction": predictions[specs[0].run_id]}
print("REPORT", json.dumps([l for l in markdown([record]).splitlines() if "not modelled" in l]))
'''


@pytest.mark.slow  # three CLIs in fresh interpreters: ~6 s idle
def test_plan_run_and_report_say_not_modelled_in_one_line(tmp_path):
    (tmp_path / "sb_offload_row.py").write_text(OFFLOAD_ROW)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "PYTHONWARNINGS": "ignore::FutureWarning"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "Traceback" not in out + proc.stderr
    assert "EXIT 0" in out
    said = [line for line in out.splitlines()
            if "not modelled" in line and not line.startswith(("UNPL", "PANEL", "REP"))]
    assert said == ["fsdp-partial w2: not modelled: fsdp-partial: an FSDP engine with params, grads, optimizer "
                    "not all sharded"], out
    assert re.search(r"^zero2 \| 2 \|", out, flags=re.M), out  # the modelled row is still planned
    fields = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in out.splitlines()
              if line.split(" ", 1)[0] in ("WHY", "UNPLANNED", "PANEL", "REPORT")}
    assert fields["WHY"] == "None"
    unplanned = json.loads(fields["UNPLANNED"])
    assert len(unplanned) == 1 and unplanned[0].startswith("fsdp-partial-w2-") and "not modelled:" in unplanned[0]
    panel = json.loads(fields["PANEL"])
    assert panel[0].startswith("fsdp-partial w2: not modelled:") and "peak" in panel[1]
    assert len(json.loads(fields["REPORT"])) == 1
