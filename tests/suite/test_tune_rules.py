"""`shardbench tune` keeps its promises (issue 32), on a stand-in backend and planner (fast; the
real runs are in test_tune.py): the space holds only knobs that act on the layout (from the
contract's attributes), nothing predicted over the limit is launched (the default included, and
TUNING.md says it breaks the limit), the measured tensor peak is what is compared, pruning waits
for several measured steps, and TUNING.md lists every trial and gives a verdict with flags."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("optuna")

from shardbench.suite.execute import events as ev  # noqa: E402
from tests import synthetic  # noqa: E402
from shardbench.suite.matrix.expand import MatrixSpec  # noqa: E402
from shardbench.suite.tune.tuner import MIN_PRUNE_STEPS, Tuner, search_space, write_outputs  # noqa: E402
from shardbench.trainer import contract  # noqa: E402

MIB = 2 ** 20


def names(strategy: str) -> set[str]:
    return {k.name for k in search_space(strategy, 8)}


def test_the_space_holds_only_knobs_that_act_on_the_layout(monkeypatch):
    assert names("ddp") == {"micro_batch", "activation_checkpointing", "bucket_mib"}
    assert names("fsdp") == {"micro_batch", "activation_checkpointing", "fsdp_grad_sync", "reshard_after_forward"}
    assert names("zero1") == names("zero2") == {"micro_batch", "activation_checkpointing", "bucket_mib"}
    assert names("zero3") == {"micro_batch", "activation_checkpointing", "bucket_mib", "reshard_after_forward"}
    # --space cannot put a knob back where it does nothing
    assert "reshard_after_forward" not in {k.name for k in search_space("ddp", 8, {"reshard_after_forward": [False]})}
    # Derived from the row's attributes, not its name: a made-up DeepSpeed layout sharding parameters.
    row = replace(contract.STRATEGIES["zero3"], name="made-up")
    monkeypatch.setitem(contract.STRATEGIES, "made-up", row)
    assert names("made-up") == names("zero3")


def test_offload_and_hpz_are_searched_on_request_where_the_layout_can_place_them():
    """APPLIES knows --offload (not ddp; only the placements the rules accept) and hpZ (ZeRO-3);
    the default search leaves both out (the test above pins it), --space puts them in."""
    asked = {"offload": ["none", "optimizer", "params"], "zero_hpz_partition_size": [1, 2]}
    space = {s: {k.name: k.values for k in search_space(s, 8, asked)} for s in contract.STRATEGIES}
    assert "offload" not in space["ddp"] and "zero_hpz_partition_size" not in space["ddp"]
    assert space["zero1"]["offload"] == space["zero2"]["offload"] == ("none", "optimizer")
    assert space["zero3"]["offload"] == ("none", "optimizer", "params")
    assert space["fsdp"]["offload"] == ("none", "params")
    assert [s for s in space if "zero_hpz_partition_size" in space[s]] == ["zero3"]
    assert all(k.name not in ("offload", "zero_hpz_partition_size") for s in contract.STRATEGIES
               for k in search_space(s, 8))


class StandIn:
    """A backend that 'runs' a spec at once: tok/s and tensor peak from its micro-batch, progress
    events per measured step, stopping when cancelled."""

    name = "stand-in"

    def __init__(self, tps, overloaded=()):
        self.tps, self.overloaded, self.launched, self.n = tps, overloaded, [], 0

    def run(self, spec, run_dir, emit, cancel, timeout_s):
        self.launched.append(spec)
        self.n += 1
        tps = self.tps[spec.micro_batch] * (1 + 0.01 * (self.n % 3))
        for step in range(spec.warmup_steps + 1, spec.steps + 1):
            emit(ev.RunProgress(spec.run_id, step, spec.steps, tokens_per_s=tps, phase="measure"))
            if cancel.is_set():
                rec = synthetic.record(spec.strategy, spec.world_size, tps, status="cancelled")
                rec.update(run_id=spec.run_id, config_id=spec.config_id, measured_steps=step - spec.warmup_steps)
                return rec
        rec = synthetic.record(spec.strategy, spec.world_size, tps, seq_len=spec.seq_len,
                               micro_batch=spec.micro_batch, grad_accum=spec.grad_accum, repeat=spec.repeat,
                               tensor_peak_bytes=spec.micro_batch * 30 * MIB, peak_memory_bytes=5 * MIB)
        rec.update(run_id=spec.run_id, config_id=spec.config_id, steps=spec.steps, warmup_steps=spec.warmup_steps,
                   seed=spec.seed)
        if spec.micro_batch in self.overloaded:
            rec.update(cpu_count=2, load_avg_1m_start=9.0, load_avg_1m_end=9.0)
        return rec


def base(**kw) -> MatrixSpec:
    return MatrixSpec(strategies=["ddp"], world_sizes=[1], seq_lens=[32], micro_batch=4, global_batch=8, steps=8,
                      warmup_steps=2, precision="fp32", device="cpu", shape="cpu", **kw)


def tune(tmp_path, backend, limit, trials=4, seed=0, **space):
    tuner = Tuner(base(), backend, tmp_path / "tune", limit, trials, 3,
                  {"activation_checkpointing": [False], "bucket_mib": [25.0], **space}, seed=seed)
    tuner.planner = lambda cfg, world: cfg.micro_batch * 30 * MIB  # predicted = what the stand-in measures
    tuning = tuner.study("ddp")
    tuner.remeasure(tuning)
    return tuning, write_outputs(tuner, [tuning]).read_text()


def test_nothing_predicted_over_the_limit_runs_and_the_default_is_said_to_break_it(tmp_path):
    backend = StandIn({1: 500.0, 2: 900.0, 4: 1500.0, 8: 2500.0})
    tuning, text = tune(tmp_path, backend, limit=100 * MIB)  # micro-batch 4 (the default) predicted 120 MiB
    assert {s.micro_batch for s in backend.launched} == {1, 2}
    assert tuning.best["micro_batch"] == 2 and tuning.default_over.startswith("predicted 120.0 MiB > limit 100.0")
    assert "the default breaks the limit (predicted 120.0 MiB > limit 100.0 MiB)" in text
    assert "not run (over the limit)" in text
    trials = text.split("## Trials: ddp", 1)[1]
    assert trials.count("| rejected before launch |") == 2 and "measured (best)" in trials
    study = json.loads((tmp_path / "tune" / "tune.json").read_text())[0]
    measured = [t for t in study["trials"] if t.get("measured_peak_bytes")]
    assert all(t["measured_peak_bytes"] == t["params"]["micro_batch"] * 30 * MIB for t in measured)  # the tensor peak


@pytest.mark.slow  # a tuning report with plots: ~5 s idle
def test_tuned_vs_default_is_a_verdict_with_flags(tmp_path):
    backend = StandIn({1: 500.0, 2: 900.0, 4: 1500.0, 8: 2500.0}, overloaded={8})
    tuning, text = tune(tmp_path, backend, limit=None)
    assert tuning.best["micro_batch"] == 8
    row = next(line for line in text.splitlines() if line.startswith("| ddp |"))
    assert "not decided: the faster one (tuned) is flagged" in row and "host overloaded" in row
    backend = StandIn({1: 500.0, 2: 900.0, 4: 1500.0, 8: 2500.0})
    _, text = tune(tmp_path / "quiet", backend, limit=None)
    row = next(line for line in text.splitlines() if line.startswith("| ddp |"))
    assert "tuned faster (Welch p" in row and "[" in row


def test_pruning_waits_for_several_measured_steps(tmp_path):
    backend = StandIn({1: 100.0, 2: 900.0, 4: 1500.0, 8: 2500.0})
    tuning, text = tune(tmp_path, backend, limit=None, trials=2, seed=1, micro_batch=[8, 1])  # seed 1: 8 first
    pruned = [t for t in tuning.trials if t["state"] == "PRUNED"]
    assert len(pruned) == 1 and pruned[0]["params"]["micro_batch"] == 1
    assert f"at measured step {MIN_PRUNE_STEPS} " in pruned[0]["reason"]  # not at the first
    assert "| pruned |" in text


def test_the_memory_limit_of_an_offload_trial_is_its_device_bytes():
    """On a GPU, state on the host does not count against the GPU's limit; on a CPU run host and
    device memory are one, so offload frees nothing there."""
    from shardbench.suite.matrix.planning import peak_bytes_per_rank
    from shardbench.trainer.config import RunConfig

    def peak(device, offload):
        return peak_bytes_per_rank(RunConfig(strategy="zero2", offload=offload, device=device, precision="fp32",
                                             seq_len=32, global_batch=8), 2)

    assert peak("cuda", "optimizer") < peak("cuda", "none")
    assert peak("cpu", "optimizer") >= peak("cpu", "none")
