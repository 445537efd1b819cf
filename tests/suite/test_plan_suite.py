"""The planner in the suite: each record carries its prediction (the runner puts it there), the
report's plan section compares it with the measurement, and `shardbench run --strict` refuses a
run predicted over its device's memory."""
from __future__ import annotations

import json

import pytest

from tests.suite.test_runner import no_launchers, specs
from shardbench.suite.report import plan_section as plan_report
from shardbench.suite.matrix.planning import over_memory, plan_input
from shardbench.suite.execute.runner import Runner

PRED = {"input": {"strategy": "ddp", "world_size": 2, "model": "tiny", "seq_len": 64, "micro_batch": 2,
                  "grad_accum": 1, "precision": "fp32", "device": "cpu"},
        "model_state_bytes": 40 * 2 ** 20, "tensor_peak_bytes": 66 * 2 ** 20, "peak_bytes": 66 * 2 ** 20,
        "comm_per_step": {"all_reduce": {"calls": 2.0, "bytes": 10e6}}, "fits": None, "links": {},
        "step_time": {"seconds": None}, "assumptions": ["an assumption"]}


def measured(**kw) -> dict:
    r = {"run_id": "ddp-w2", "status": "ok", "world_size": 2, "device": "cpu", "strategy": "ddp",
         "model": {"preset": "tiny"}, "seq_len": 64, "micro_batch": 2, "grad_accum": 1, "precision": "fp32",
         "tensor_peak_bytes": 60 * 2 ** 20, "model_state": [{"total_bytes": 40 * 2 ** 20, "comm_buffer_bytes": 0}],
         "comm_per_step": {"all_reduce": {"calls": 2.0, "bytes": 10e6}}, "step_time_s": {"mean": 0.2},
         "tokens_per_s": 1000.0, "flops_per_token": 1e7, "prediction": PRED}
    r.update(kw)
    return r


def test_plan_section_prints_predicted_beside_measured_with_the_error():
    text = plan_report.markdown([measured()])
    row = next(line for line in text.splitlines() if line.startswith("| ddp-w2"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["40.0 / 40.0", "+0.0%", "66.0 / 60.0", "+10.0%", "+0.0%"]
    assert "- an assumption" in text


def test_plan_section_calibrates_step_time_on_the_world_size_1_run():
    base = measured(run_id="ddp-w1", world_size=1, prediction=None, tokens_per_s=2000.0)
    text = plan_report.markdown([measured(), base])
    row = next(line for line in text.splitlines() if line.startswith("| ddp-w2"))
    step = [c.strip() for c in row.strip("|").split("|")][8]
    assert step.endswith("/ 0.2") and step != "-"


def test_plan_section_compares_modeled_and_in_flight_collective_seconds():
    pred = {**PRED, "step_time": {"seconds": None, "comm_s": 0.02}}
    rec = measured(prediction=pred, comm_per_step={"all_reduce": {"calls": 2.0, "bytes": 10e6, "seconds": 0.05}})
    row = next(line for line in plan_report.markdown([rec]).splitlines() if line.startswith("| ddp-w2"))
    assert [c.strip() for c in row.strip("|").split("|")][6:8] == ["0.02 / 0.05", "-60.0%"]
    # A record from before the counter timed collectives: the prediction alone.
    old = measured(prediction=pred)
    row = next(line for line in plan_report.markdown([old]).splitlines() if line.startswith("| ddp-w2"))
    assert [c.strip() for c in row.strip("|").split("|")][6:8] == ["0.02 / -", "-"]


def test_plan_section_says_when_no_record_has_a_prediction():
    assert "No ok record carries a prediction" in plan_report.markdown([measured(prediction=None)])


def test_runner_puts_the_prediction_into_the_record(tmp_path):
    """A failed run (no launcher here) keeps its prediction too: nothing measured or planned is lost."""
    runs = specs(strategies=["ddp"], world_sizes=[1])
    records = Runner(runs, no_launchers(tmp_path), tmp_path / "results",
                     predictions={runs[0].run_id: PRED}).run()
    assert records[0]["prediction"] == PRED
    saved = json.loads((tmp_path / "results" / runs[0].run_id / "result.json").read_text())
    assert saved["prediction"] == PRED


def test_plan_input_resolves_auto_device_and_precision():
    spec = specs(strategies=["fsdp"], world_sizes=[2])[0]
    inp = plan_input(spec)
    assert (inp.strategy, inp.world_size, inp.device, inp.precision) == ("fsdp", 2, "cpu", "fp32")
    over = over_memory([spec], {spec.run_id: {**PRED, "fits": False, "peak_bytes": 30 * 2 ** 30,
                                              "device_memory_bytes": 24 * 2 ** 30}})
    assert len(over) == 1 and "30.0 GiB" in over[0] and "> 24 GiB" in over[0]


@pytest.mark.slow
def test_strict_refuses_a_matrix_with_a_run_predicted_over_memory(tmp_path, capsys):
    """gpt2-1.3b widened to 48 layers (2.6 B params, 16 B/param under DDP = 39 GiB of state) on
    one 24 GiB A10 (a cluster matrix: refused before any cluster is contacted), with the reason."""
    from shardbench.suite.cli.commands import main

    code = main(["run", "--shape", "a10", "--model", "gpt2-1.3b", "--set", "n_layer=48", "--seq-lens", "128",
                 "--micro-batch", "1", "--strategies", "ddp", "--world-sizes", "1", "--device", "cpu",
                 "--precision", "fp32", "--results", str(tmp_path / "r"), "--strict", "--quiet",
                 "--backend", "kubernetes"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "predicted peak" in err and "> 24 GiB on a10" in err and "refused" in err
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


@pytest.mark.slow
def test_preflight_busbw_replaces_the_assumed_link_bandwidth(tmp_path, capsys):
    """The chart's pre-flight (chart/files/preflight.py) run for real on 2 gloo ranks; its
    measured busbw and latency (the smallest message's time less its bandwidth term) become the
    link the step-time model uses, and the plan says so."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.trainer.conftest import cpu_env
    from shardbench.suite.cli.commands import main

    repo = Path(__file__).resolve().parents[2]
    torchrun = Path(sys.executable).parent / "torchrun"
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(repo / "chart/files/preflight.py"),
                           "--sizes-mib", "0.25", "1", "--iters", "3", "--warmup-iters", "1", "--device", "cpu"],
                          capture_output=True, text=True, timeout=300, env=cpu_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = tmp_path / "preflight.log"
    log.write_text(proc.stdout)
    rows = [line.split() for line in proc.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    busbw = float(rows[-1][-1])  # the largest size's row (the table is followed by transport and verdict lines)
    size, time_us = int(rows[0][0]), float(rows[0][1])
    assert main(["plan", "--shape", "cpu", "--strategy", "ddp", "--world-size", "2", "--preflight-log", str(log),
                 "--json"]) == 0
    step = json.loads(capsys.readouterr().out)[0]["step_time"]
    assert step["link_GBps"] == pytest.approx(busbw)
    assert step["alpha_us"] == pytest.approx(max(0.0, time_us - size / (busbw * 1e9) * 1e6), abs=0.1)
    (tmp_path / "empty.log").write_text("no table here\n")
    assert main(["plan", "--preflight-log", str(tmp_path / "empty.log")]) == 2
    assert "no pre-flight table" in capsys.readouterr().err


class _CountingList(list):
    """A list that counts full passes over it (iterations)."""

    passes = 0

    def __iter__(self):
        type(self).passes += 1
        return super().__iter__()


def test_plan_rows_read_the_records_a_fixed_number_of_times():
    """The plan section's calibration looks bases up in an index built once: the number of passes
    over the records does not grow with the records (it was one pass per record: quadratic)."""
    from shardbench.suite.report import plan_section as plan_report
    from tests import synthetic

    passes = []
    for n in (20, 80):
        records = _CountingList(synthetic.record("ddp", 1 + i % 2, 1000.0 + i, repeat=i) for i in range(n))
        for r in records:
            r["prediction"] = {"input": {}, "assumptions": []}  # no valid input: calibration gives up
        _CountingList.passes = 0
        assert len(plan_report.rows(records)) == n
        passes.append(_CountingList.passes)
    assert passes[0] == passes[1] <= 3, passes


def test_a_matrix_plans_its_mesh_degrees():
    """tp and dp_replicate are first-class (chart) knobs, so not among a spec's extra knobs: the
    plan input still carries them (a tp run was planned as the plain layout when it read only
    the extra knobs)."""
    from shardbench.suite.matrix.expand import expand
    from shardbench.suite.matrix.specs import MatrixSpec

    got, errors = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[4], tp=2, steps=3, warmup_steps=1,
                                    max_world_size=4, n_layer=3))
    assert errors == []
    inp = plan_input(got[0])
    assert (inp.tp, inp.dp_replicate, inp.n_layer, inp.world_size) == (2, 1, 3, 4)
    got, _ = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[4], dp_replicate=2, steps=3, warmup_steps=1,
                               max_world_size=4))
    assert plan_input(got[0]).dp_replicate == 2


def test_plan_section_shows_collectives_and_memory_per_mesh_dimension():
    """An fsdp+tp 2x2 run: per dimension and op, predicted / counted calls and MiB with the
    error, and what the dimension divides; its calibrated step time keeps the per-dimension links."""
    from shardbench.trainer.plan import mesh_forms as mesh
    from shardbench.trainer.plan.inputs import PlanInput

    inp = PlanInput("fsdp", world_size=4, tp=2, seq_len=64, micro_batch=2, grad_accum=2)
    by_dim = mesh.comm_by_dim(inp)
    counted = json.loads(json.dumps(by_dim))
    counted["tp"]["all_reduce"]["bytes"] *= 1.02  # the table shows a 2% miss as -2.0%
    pred = {**PRED, "input": inp.to_dict(), "comm_per_step_by_dim": by_dim, "links": {"gpus_per_node": 2},
            "memory_by_dim": mesh.sharded_by_dim(inp)}
    run = measured(run_id="fsdp-w4-tp2", world_size=4, strategy="fsdp", comm_per_step_by_dim=counted,
                   memory_by_dim=mesh.sharded_by_dim(inp), prediction=pred)
    base = measured(run_id="fsdp-w1", world_size=1, strategy="fsdp", prediction=None, tokens_per_s=2000.0)
    text = plan_report.markdown([run, base])
    assert "Collectives and memory per mesh dimension" in text
    rows = {tuple(c.strip() for c in line.split("|")[2:5]): line for line in text.splitlines()
            if line.startswith("| fsdp-w4-tp2 | ")}
    tp_ar = rows[("tp (2)", "params, grads, optimizer, activations", "all_reduce")]
    assert "43 / 43" in tp_ar and "-2.0%" in tp_ar
    assert "+0.0%" in rows[("dp_shard (2)", "params, grads, optimizer", "all_gather")]
    assert plan_report.mesh_rows([measured()]) == []  # no mesh, no table
