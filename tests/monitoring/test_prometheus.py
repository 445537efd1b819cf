"""A real Prometheus scrapes a live two-rank trainer run, every rank on its own port
(tests/monitoring/conftest.py live_run); the values read back through its HTTP API are the run's
own numbers from its result record."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

RUN = 'run="live-prom-r0"'


def last(live, metric: str, labels: str = "", rank: int | None = 0) -> float:
    """The last scraped value of one series (series go stale once the run ends, so look back)."""
    sel = ",".join(x for x in (RUN, f'rank="{rank}"' if rank is not None else "", labels) if x)
    return live.api.value(f"last_over_time({metric}{{{sel}}}[10m])", live.end)


def test_scraped_values_are_the_runs_numbers(live_run):
    rec = live_run.record
    assert rec["status"] == "ok" and rec["checkpoint"]["resumed_from_step"] == 50
    up = live_run.api.query('max_over_time(up{job="shardbench"}[10m])', live_run.end)
    assert [float(s["value"][1]) for s in up] == [1.0, 1.0]  # both ranks' endpoints
    for rank in (0, 1):
        assert last(live_run, "shardbench_step", rank=rank) == rec["steps"] == 60
        assert last(live_run, "shardbench_finished", rank=rank) == 1
        # This process's measured steps were 51..60; 55 saved a checkpoint (the last step never
        # does) and is left out of the histogram, as the record leaves it out of its step times.
        assert last(live_run, "shardbench_step_duration_seconds_count", rank=rank) == 9
        assert last(live_run, "shardbench_memory_bytes", 'category="model_state_params"', rank) == \
            rec["model_state"][rank]["params_bytes"]
        assert last(live_run, "shardbench_memory_bytes", 'category="rss"', rank) > 0
    assert last(live_run, "shardbench_steps") == 60
    assert last(live_run, "shardbench_run_ok") == 1
    assert last(live_run, "shardbench_restarts_total") == rec["checkpoint"]["restarts"] == 1
    assert last(live_run, "shardbench_checkpoint_load_seconds") == pytest.approx(rec["checkpoint"]["load_s"])
    assert last(live_run, "shardbench_checkpoint_saves_total") == rec["checkpoint"]["saves"] == 3
    # save_s_mean covers every attempt's saves: the first run's two (25, 50; the checkpoint of 50
    # cannot hold its own time) and this run's one (55, the last save the exporter saw).
    first = live_run.first_record["checkpoint"]
    assert first["saves"] == 2
    assert rec["checkpoint"]["save_s_mean"] * 3 == pytest.approx(
        first["save_s_mean"] * 2 + last(live_run, "shardbench_checkpoint_save_seconds"), rel=1e-6)
    # Rank 0's step times are the record's: its last 9 entries are this process's.
    times = rec["step_time_s"]["all"]
    assert last(live_run, "shardbench_step_duration_seconds_sum") == pytest.approx(sum(times[-9:]))
    assert last(live_run, "shardbench_step_last_seconds") == pytest.approx(times[-1])
    tokens = last(live_run, "shardbench_tokens_per_second")
    assert tokens == pytest.approx(rec["tokens_per_step"] / times[-1])
    assert last(live_run, "shardbench_expected_tokens_per_second") == 1e9
    # The record's loss is the mean over ranks of each rank's loss: so is the ranks' series'.
    loss = live_run.api.value(f"avg(last_over_time(shardbench_loss{{{RUN}}}[10m]))", live_run.end)
    assert loss == pytest.approx(rec["final_loss"], rel=1e-6)
    # DDP's gradient all-reduce: the counter's bytes per step times the 10 measured steps here.
    per_step = rec["comm_per_step"]["all_reduce"]
    assert last(live_run, "shardbench_comm_bytes_total", 'op="all_reduce"') == pytest.approx(per_step["bytes"] * 10)
    assert last(live_run, "shardbench_comm_calls_total", 'op="all_reduce"') == pytest.approx(per_step["calls"] * 10)
    # Time with an all-reduce in flight: the record's per-step mean over the same 10 steps (the
    # exporter copies after each step; a gloo completion callback may land just after the last).
    seconds = last(live_run, "shardbench_comm_seconds_total", 'op="all_reduce"')
    assert 0 < seconds <= sum(times[-9:]) + rec["checkpoint"]["step_time_s"][-1]
    assert seconds == pytest.approx(per_step["seconds"] * 10, rel=0.1)
    info = live_run.api.query(f"last_over_time(shardbench_run_info{{{RUN}}}[10m])", live_run.end)
    (info,) = [i["metric"] for i in info]
    assert (info["strategy"], info["world_size"], info["shape"], info["launcher"]) == ("ddp", "2", "none", "torchrun")
    hashes = live_run.api.query(f"last_over_time(shardbench_nccl_env_info{{{RUN}}}[10m])", live_run.end)
    assert len(hashes) == 2 and len({h["metric"]["nccl_env"] for h in hashes}) == 1


def test_chart_rules_evaluate_on_the_live_series(live_run):
    """The chart's rules load into the real Prometheus (its targets labelled release="sb" as the
    PodMonitor labels them), evaluate without error, and none fires for this healthy run (the
    expectation of 1e9 tokens/s only fires after `for: 5m`)."""
    groups = live_run.api.get("/api/v1/rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert {r["name"] for r in rules} == {"TrainingStalled", "NoFirstStep", "RankDown", "ThroughputBelowExpectation",
                                         "StepTimeVariance", "NCCLEnvDisagreement"}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    below = next(r for r in rules if r["name"] == "ThroughputBelowExpectation")
    # The series met the condition while the run was live: the alert went pending.
    pending = live_run.api.query('max_over_time(ALERTS{alertname="ThroughputBelowExpectation",'
                                 'alertstate="pending"}[10m])', live_run.end + 1)
    assert pending and pending[0]["metric"]["run"] == "live-prom-r0", (below, pending)
    assert pending[0]["metric"]["release"] == "sb"
    firing = live_run.api.query('max_over_time(ALERTS{alertstate="firing"}[10m])', live_run.end + 1)
    assert firing == [], firing
    # The endpoints closed after the run, having said it ended: no dead rank. (A scrape that timed
    # out on this loaded machine may have made RankDown pending for a moment mid-run: its `for`
    # is what keeps that from firing.)
    assert live_run.api.query('ALERTS{alertname="RankDown"}', live_run.end + 1) == []
