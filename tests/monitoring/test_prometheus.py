"""A real Prometheus scrapes a live trainer run's rank 0 (tests/monitoring/conftest.py live_run);
the values read back through its HTTP API are the run's own numbers from its result record."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

RUN = '{run="live-prom-r0"}'


def last(live, metric: str, labels: str = RUN) -> float:
    """The last scraped value (series go stale once the run ends, so look back over the run)."""
    return live.api.value(f"last_over_time({metric}{labels}[10m])", live.end)


def test_scraped_values_are_the_runs_numbers(live_run):
    rec = live_run.record
    assert rec["status"] == "ok" and rec["checkpoint"]["resumed_from_step"] == 50
    up = live_run.api.query('max_over_time(up{job="shardbench"}[10m])', live_run.end)
    assert [float(s["value"][1]) for s in up] == [1.0]
    assert last(live_run, "shardbench_step") == rec["steps"] == 60
    assert last(live_run, "shardbench_steps") == 60
    assert last(live_run, "shardbench_finished") == 1 and last(live_run, "shardbench_run_ok") == 1
    assert last(live_run, "shardbench_restarts") == rec["checkpoint"]["restarts"] == 1
    assert last(live_run, "shardbench_checkpoint_load_seconds") == pytest.approx(rec["checkpoint"]["load_s"])
    assert last(live_run, "shardbench_checkpoint_saves") == rec["checkpoint"]["saves"]
    # The histogram holds every measured step this process ran (steps 51..60), checkpoint steps too.
    assert last(live_run, "shardbench_step_duration_seconds_count") == 10
    assert last(live_run, "shardbench_step_last_seconds") == pytest.approx(rec["step_time_s"]["all"][-1])
    tokens = last(live_run, "shardbench_tokens_per_second")
    assert tokens == pytest.approx(rec["tokens_per_step"] / rec["step_time_s"]["all"][-1])
    assert last(live_run, "shardbench_expected_tokens_per_second") == 1e9
    state = rec["model_state"][0]
    assert last(live_run, "shardbench_memory_bytes", '{run="live-prom-r0",category="model_state_params"}') == \
        state["params_bytes"]
    assert last(live_run, "shardbench_memory_bytes", '{run="live-prom-r0",category="rss"}') > 0
    # DDP's gradient all-reduce: the counter's bytes per step times the 10 measured steps here.
    per_step = rec["comm_per_step"]["all_reduce"]
    assert last(live_run, "shardbench_comm_bytes_total", '{run="live-prom-r0",op="all_reduce"}') == \
        pytest.approx(per_step["bytes"] * 10)
    assert last(live_run, "shardbench_comm_calls_total", '{run="live-prom-r0",op="all_reduce"}') == \
        pytest.approx(per_step["calls"] * 10)
    # Time with an all-reduce in flight: the record's per-step mean over the same 10 steps (the
    # exporter adds after each step; a gloo completion callback may land just after the last).
    seconds = last(live_run, "shardbench_comm_seconds_total", '{run="live-prom-r0",op="all_reduce"}')
    assert 0 < seconds <= last(live_run, "shardbench_step_duration_seconds_sum")
    assert seconds == pytest.approx(per_step["seconds"] * 10, rel=0.1)
    info = live_run.api.query(f"last_over_time(shardbench_run_info{RUN}[10m])", live_run.end)[0]["metric"]
    assert (info["strategy"], info["world_size"], info["shape"], info["launcher"]) == ("ddp", "2", "none", "torchrun")


def test_chart_rules_evaluate_on_the_live_series(live_run):
    """The chart's rules load into the real Prometheus, evaluate without error, and none fires
    for this healthy run (the expectation of 1e9 tokens/s only fires after `for: 5m`)."""
    groups = live_run.api.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} == {"TrainingStalled", "ThroughputBelowExpectation", "StepTimeVariance",
                                         "NCCLEnvDisagreement"}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    below = next(r for r in rules if r["name"] == "ThroughputBelowExpectation")
    # The series met the condition while the run was live: the alert went pending.
    pending = live_run.api.query('max_over_time(ALERTS{alertname="ThroughputBelowExpectation",'
                                 'alertstate="pending"}[10m])', live_run.end + 1)
    assert pending and pending[0]["metric"]["run"] == "live-prom-r0", (below, pending)
