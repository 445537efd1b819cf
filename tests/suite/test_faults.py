"""The fault axis through the suite, on real runs: for every strategy a rank is SIGKILLed mid-run,
the local backend relaunches it with --resume auto, and the run's one record has the loss per
step of the same configuration run without a fault (its trainer command line, forked from the
test session's fork server and shared: a launcher does not change a loss); a SIGSTOPped rank (a
hang) ends in the process-group timeout and is recovered the same way under every launcher; so
is a killed launcher. The fast tests check the axis itself (parsing, validation, ids)."""
from __future__ import annotations

import json

import pytest

from shardbench.trainer import contract
from shardbench.suite.backends import get_backend
from shardbench.suite.faults.restart import Fault, fault_errors, parse_fault
from shardbench.suite.matrix.expand import expand, matrix_from_dict
from shardbench.suite.execute.runner import Runner
from tests.reference_runs import SHARED, shared_run

STRATEGIES = list(contract.STRATEGIES)  # a new row of the contract's table runs here too
BASE = {"world_sizes": [2], "seq_lens": [32], "steps": 8, "warmup_steps": 1, "repeats": 1, "precision": "fp32",
        "device": "cpu", "shape": "cpu", "checkpoint_every": 3, "pg_timeout_s": 10, "timeout_s": 240,
        "max_restarts": 2}
# Every strategy loses rank 1 at step 5 (checkpoint at 3: steps 4 and 5 are redone), and fsdp
# also loses its launcher. Hangs: test_a_stopped_rank_..._under_every_launcher.
FAULTS = {**{s: ["kill-rank:1@5"] for s in STRATEGIES}, "fsdp": ["kill-rank:1@5", "kill-launcher@5"]}


def specs_for(strategy: str, faults: list[str], **extra):
    specs, errors = expand(matrix_from_dict({**BASE, "strategies": [strategy], "faults": faults, **extra}))
    assert not errors, errors
    return specs


def reference(strategy: str) -> dict:
    """The fault-free record of the matrix's configuration of this strategy: its trainer command
    line as a shared run whose two ranks fork from the fork server (tests/reference_runs.py)."""
    spec = specs_for(strategy, ["none"])[0]
    args = [*spec.trainer_args(output_dir=f"{SHARED}/out"), "--checkpoint-dir", f"{SHARED}/ckpt"]  # saves as the suite's
    run = shared_run(args, launcher="torchrun", nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads((run.dir / "out" / "result.json").read_text())
    assert record["status"] == "ok" and record["fault"] is None, record["error"]
    return record


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    """(strategy, fault, max_restarts) -> record, all from one matrix run through the runner."""
    specs = [s for strategy, faults in FAULTS.items() for s in specs_for(strategy, faults)]
    specs += specs_for("ddp", ["kill-rank:1@5"], max_restarts=0)  # no relaunch allowed: a failed row
    results = tmp_path_factory.mktemp("faults")
    records = Runner(specs, get_backend("local"), results, order_seed=1).run()
    by_id = {r["run_id"]: r for r in records}
    return {(s.strategy, s.fault, s.max_restarts): by_id[s.run_id] for s in specs}, results


def assert_same_losses(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b) == BASE["steps"]
    for step, (x, y) in enumerate(zip(a, b)):
        assert abs(x - y) <= 1e-6 * abs(y), f"step {step}: {x} vs {y}"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_killed_rank_restarts_and_matches_the_uninterrupted_run(records, strategy):
    recs, results = records
    clean, faulty = reference(strategy), recs[(strategy, "kill-rank:1@5", 2)]
    assert faulty["status"] == "ok", faulty["error"]
    assert_same_losses(faulty["loss_per_step"], clean["loss_per_step"])
    fault = faulty["fault"]
    assert fault["attempts"] == 2 and fault["injected_at_step"] >= 5
    assert faulty["checkpoint"]["resumed_from_step"] == 3 and faulty["checkpoint"]["restarts"] == 1
    assert fault["steps_redone"] == fault["injected_at_step"] - 3
    assert fault["detection_s"] >= 0 and fault["restart_s"] > 0
    assert fault["recovery_s"] == pytest.approx(fault["detection_s"] + fault["restart_s"])
    assert 0 < fault["goodput_tokens_per_s"] < faulty["tokens_per_s"]
    run_dir = results / faulty["run_id"]
    log = (run_dir / "log.txt").read_text()
    assert "===== launch 1 =====" in log and "sent SIGKILL" in log
    assert not (run_dir / "checkpoints").exists()  # an ok run's checkpoints are removed
    assert json.loads((run_dir / "result.json").read_text())["fault"] == fault


@pytest.mark.slow
def test_a_killed_launcher_restarts_and_resumes(records):
    recs, _ = records
    clean, faulty = reference("fsdp"), recs[("fsdp", "kill-launcher@5", 2)]
    assert faulty["status"] == "ok", faulty["error"]
    assert_same_losses(faulty["loss_per_step"], clean["loss_per_step"])
    assert faulty["fault"]["attempts"] == 2


@pytest.mark.slow
def test_a_launch_that_fails_before_the_fault_passes_it_on(tmp_path, monkeypatch):
    """The first launch's rendezvous port is held by another socket, so rank 0 fails on EADDRINUSE
    before its first step (as a CI run did when a connection took the port). The fault goes into
    the next launch: the record names the first launch's error, and its recovery fields measure
    the fault (before, the fault was never injected and the record read as a recovered fault)."""
    import socket

    from shardbench.suite.backends import local

    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        first = [held.getsockname()[1]]
        drawn = local.free_port
        monkeypatch.setattr(local, "free_port", lambda: first.pop() if first else drawn())
        [rec] = Runner(specs_for("zero1", ["kill-rank:1@5"]), get_backend("local"), tmp_path, order_seed=1).run()
    assert rec["status"] == "ok", rec["error"]
    assert_same_losses(rec["loss_per_step"], reference("zero1")["loss_per_step"])
    fault = rec["fault"]
    assert fault["attempts"] == 3 and fault["injected_at_step"] >= 5
    assert len(fault["failed_before_fault"]) == 1 and "EADDRINUSE" in fault["failed_before_fault"][0]
    assert fault["steps_redone"] == fault["injected_at_step"] - 3 and fault["restart_s"] > 0
    log = (tmp_path / rec["run_id"] / "log.txt").read_text()
    assert "sent SIGKILL" in log.split("===== launch 1 =====")[1].split("===== launch 2 =====")[0]


@pytest.mark.slow
def test_a_fault_without_restarts_left_is_a_failed_row_with_the_reason(records):
    recs, _ = records
    failed = recs[("ddp", "kill-rank:1@5", 0)]
    assert failed["status"] == "failed" and failed["fault"]["attempts"] == 1
    assert failed["error"].startswith("1 attempts, none finished (max_restarts 0)")
    assert failed["fault"]["detection_s"] is not None and failed["fault"]["restart_s"] is None
    assert failed["loss_per_step"]  # what was measured before the fault is kept


def test_fault_specs_parse_and_print_back():
    assert parse_fault("none") is None
    assert parse_fault("kill-rank:1@12") == Fault("kill-rank", 12, 1)
    assert parse_fault("stop-rank:0@3") == Fault("stop-rank", 3, 0)
    assert parse_fault("kill-launcher@7") == Fault("kill-launcher", 7)
    assert str(parse_fault("kill-rank:1@12")) == "kill-rank:1@12"
    for bad in ("kill-rank@3", "kill:1@2", "stop-rank:1", "kill-launcher:0@3", 5):
        with pytest.raises(ValueError, match="kill-rank:R@S"):
            parse_fault(bad)


def test_faults_that_cannot_fire_are_refused():
    assert fault_errors("kill-rank:2@5", world_size=2, steps=10) == [
        "fault kill-rank:2@5 names rank 2 but the run has 2 rank(s)"]
    assert "use a step from 1 to 9" in fault_errors("kill-rank:0@10", 2, 10)[0]
    _, errors = expand(matrix_from_dict({**BASE, "strategies": ["ddp"], "world_sizes": [1, 2],
                                         "faults": ["kill-rank:1@5", "bogus"]}))
    assert any("names rank 1 but the run has 1" in e for e in errors)
    assert any("'bogus'" in e for e in errors)


def test_the_fault_axis_multiplies_runs_and_changes_only_faulty_ids():
    plain = specs_for("ddp", ["none"])
    both = specs_for("ddp", ["none", "kill-rank:1@5", "stop-rank:0@4"])
    assert len(both) == 3 and len({s.run_id for s in both}) == 3
    assert both[0].run_id == plain[0].run_id and both[0].max_restarts == 0  # fault-free ids unchanged
    fewer = specs_for("ddp", ["kill-rank:1@5"], max_restarts=0)
    assert fewer[0].run_id != both[1].run_id  # the restarts allowed change the outcome
    assert both[1].fault == "kill-rank:1@5" and both[1].max_restarts == 2
    # The cluster backend injects kill-rank (it deletes the rank's worker pod); the other kinds
    # need the ranks' processes and are refused there, one line each.
    kube = {**BASE, "strategies": ["ddp"], "backend": "kubernetes", "shape": "cpu"}
    specs, errors = expand(matrix_from_dict({**kube, "faults": ["kill-rank:1@5"]}))
    assert not errors and specs[0].fault == "kill-rank:1@5" and specs[0].max_restarts == 2
    _, errors = expand(matrix_from_dict({**kube, "faults": ["stop-rank:1@5", "kill-launcher@4"]}))
    assert errors == [
        "fault stop-rank:1@5 cannot be injected on a cluster (kubernetes, or ray with ray_cluster: it deletes "
        "a worker pod): use kill-rank:R@S there, or a local backend",
        "fault kill-launcher@4 cannot be injected on a cluster (kubernetes, or ray with ray_cluster: it deletes "
        "a worker pod): use kill-rank:R@S there, or a local backend"]


def test_a_matrix_may_not_set_the_checkpoint_dir_or_resume():
    for key in ("checkpoint_dir", "resume"):
        with pytest.raises(ValueError, match="unknown matrix key"):
            matrix_from_dict({key: "x"})


def _ckpt_record(strategy, world, step_s, save_s, recovery_s=None, redone=2, every=10):
    from dataclasses import asdict

    from shardbench.trainer.record import CheckpointCost, FaultRecovery
    from tests import synthetic

    rec = synthetic.record(strategy=strategy, world_size=world)
    rec["step_time_s"]["mean"] = step_s
    rec["checkpoint"] = asdict(CheckpointCost(every=every, saves=3, save_s_mean=save_s, blocking_s_mean=save_s,
                                              size_bytes=4_000_000, size_bytes_per_rank=[2_500_000, 1_500_000]))
    if recovery_s is not None:
        rec["fault"] = asdict(FaultRecovery(fault="kill-rank:1@5", attempts=2, recovery_s=recovery_s,
                                            steps_redone=redone))
    return rec


def test_fault_table_uses_youngs_interval_and_states_the_failure_rate():
    from shardbench.suite.report import fault_section as fr

    records = [_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0, recovery_s=30.0),
               _ckpt_record("ddp", 2, step_s=0.5, save_s=2.0),
               _ckpt_record("zero3", 2, step_s=1.0, save_s=8.0)]
    rows = {(r.strategy, r.world_size): r for r in fr.rows(records, device_mtbf_hours=1.0)}
    ddp = rows[("ddp", 2)]
    mtbf = 3600.0 / 2  # one failure per device-hour, two devices
    assert ddp.runs == 2 and ddp.fault_runs == 1 and ddp.mtbf_s == mtbf
    assert ddp.save_pct == pytest.approx(100 * 2.0 / (10 * 0.5))
    assert ddp.goodput_pct == pytest.approx(100 * (1 - 2.0 / 5.0 - (2.5 + 30.0) / mtbf))
    young_s = (2 * 2.0 * mtbf) ** 0.5  # sqrt(2 C M) = 84.85 s = 170 steps of 0.5 s
    assert ddp.young_every == round(young_s / 0.5) == 170
    assert ddp.young_goodput_pct > ddp.goodput_pct
    # Young's interval is the best one: a shorter or longer interval does worse.
    best = fr.goodput_share(2.0, young_s, 30.0, mtbf)
    assert best > fr.goodput_share(2.0, young_s / 2, 30.0, mtbf) and best > fr.goodput_share(2.0, young_s * 2, 30.0, mtbf)
    # Without a fault run there is no measured recovery: no goodput, said so.
    assert rows[("zero3", 2)].goodput_pct is None and rows[("zero3", 2)].save_pct == pytest.approx(80.0)
    text = fr.markdown(records, device_mtbf_hours=1.0)
    assert "## Fault tolerance" in text and "one failure per 1 device-hours" in text
    assert "| ddp | 2 | 2 (1) | 4.0 | 2.5 |" in text
    assert fr.markdown([synthetic_plain()]) == ""


def test_the_launchers_own_wait_after_a_rank_reported_is_not_recovery():
    """merge's arithmetic on a timeline: the fault at 100 s, rank 0 reports the hang at 130 s, the
    launcher exits at 161 s (torchrun's grace), the relaunch steps at 170 s. Detection ends at the
    report, the 31 s between report and exit are the launcher's, recovery is 30 + 9 and the fault
    table shows that; without a rank's report detection ends at the launcher's exit."""
    from types import SimpleNamespace

    from shardbench.suite.faults.restart import merge
    from shardbench.suite.report import fault_section as fr

    spec = specs_for("ddp", ["stop-rank:1@5"])[0]

    def attempts(failed_at):
        first = SimpleNamespace(injected_at=100.0, injected_step=5, last_step=5, first_step_at=1.0,
                                failed_at=failed_at, failed_line="rank 0: timeout")
        again = SimpleNamespace(injected_at=None, injected_step=None, last_step=8, first_step_at=170.0)
        ok = {**_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0), "checkpoint": {
            **_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0)["checkpoint"], "resumed_from_step": 3}}
        return [({"status": "failed"}, first, 161.0), (ok, again, 180.0)]

    fault = merge(spec, attempts(130.0), 90.0)["fault"]
    assert (fault["detection_s"], fault["launcher_wait_s"], fault["restart_s"], fault["recovery_s"]) == (30, 31, 9, 39)
    assert fault["detected_by"] == "rank 0: timeout"
    assert fr.rows([merge(spec, attempts(130.0), 90.0)])[0].recovery_s == 39
    fault = merge(spec, attempts(None), 90.0)["fault"]
    assert (fault["detection_s"], fault["launcher_wait_s"], fault["detected_by"]) == (61, 0, "launcher exit")


def synthetic_plain():
    from tests import synthetic

    return synthetic.record()


def test_the_report_has_the_fault_table(tmp_path):
    from shardbench.suite.report.markdown import report_from_records

    records = [_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0, recovery_s=30.0)]
    report = report_from_records(records, tmp_path / "out", tmp_path)
    assert "## Fault tolerance" in report.markdown.read_text()


def test_benchtui_results_show_the_same_fault_table():
    from shardbench.tui.app.results_model import compute
    from shardbench.suite.report import fault_section as faults_report

    records = [_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0, recovery_s=30.0)]
    lines = compute(records).fault_table
    assert lines == faults_report.text_lines(records)
    assert "Young's every (steps)" in lines[0] and lines[1].split()[:2] == ["ddp", "2"]
    assert compute([synthetic_plain()]).fault_table == []


async def test_the_results_screen_shows_the_fault_table():
    from textual.app import App
    from textual.widgets import Static

    from shardbench.tui.app.results_model import compute
    from shardbench.tui.app.screens.results import ResultsScreen

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(ResultsScreen())

    app = Host()
    async with app.run_test(size=(220, 60)) as pilot:
        await pilot.pause()
        app.screen.show(compute([_ckpt_record("ddp", 2, step_s=0.5, save_s=2.0, recovery_s=30.0)]))
        await pilot.pause()
        shown = str(app.screen.query_one("#winners", Static).render())
        assert "Fault tolerance" in shown and "Young's every (steps)" in shown


@pytest.mark.slow
@pytest.mark.parametrize("strategy,launcher", [("ddp", "torchrun"), ("ddp", "mpirun"), ("zero3", "deepspeed")])
def test_a_stopped_rank_is_detected_by_the_other_ranks_report_under_every_launcher(tmp_path, strategy, launcher):
    """A SIGSTOPped rank (a hang) ends in the process-group timeout, not the run's limit, and
    the run resumes to the fault-free losses. torchrun SIGTERMs a stopped rank and waits 30 s
    before SIGKILL (mpirun SIGCONTs it first): the fault table charged those 30 s to the strategy
    (detection 61 s against 30-31 s). Once another rank reports the hang, the suite continues the
    stopped rank, so it ends on the SIGTERM; and detection ends at that report under every
    launcher, the launcher's own wait after it recorded apart and left out of the recovery
    (issue 35 item 6)."""
    specs = specs_for(strategy, ["stop-rank:1@5"], launcher=launcher, max_restarts=1)
    record = Runner(specs, get_backend("local"), tmp_path / "r", order_seed=1).run()[0]
    assert record["status"] == "ok", record.get("error")
    assert_same_losses(record["loss_per_step"], reference(strategy)["loss_per_step"])
    fault = record["fault"]
    assert BASE["pg_timeout_s"] <= fault["detection_s"] < 60 and fault["attempts"] == 2
    # The surviving rank's own report of the hang ended detection, whatever launcher ran it.
    assert fault["detected_by"] in ("rank 0: timeout", "rank 0: failed"), fault
    assert fault["detection_s"] >= 0 and fault["launcher_wait_s"] >= 0 and fault["restart_s"] > 0
    assert fault["recovery_s"] == pytest.approx(fault["detection_s"] + fault["restart_s"])
    # Where it resumed from, as a path: its own checkpoint, under its own results dir.
    run_dir = tmp_path / "r" / record["run_id"]
    assert record["checkpoint"]["resumed_from"].startswith(f"{run_dir}/checkpoints/step-")
    assert record["checkpoint"]["resumed_from_output_dir"] is True
    if launcher == "torchrun":  # prterun continues and ends the stopped rank itself
        log = "\n".join(p.read_text(errors="replace") for p in (tmp_path / "r").rglob("log.txt"))
        # the stopped rank 1 ran again and failed on its own (torchrun's SIGTERM, or its broken
        # group): torchrun never had to SIGKILL it
        assert "rank 1: failed: " in log and "exitcode  : -9" not in log, log[-3000:]
