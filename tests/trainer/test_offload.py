"""Where model state lives (--offload: ZeRO-Offload, ZeRO-3 parameter offload, FSDP2's
CPUOffloadPolicy) and ZeRO++ hpZ: every row trains to one process's losses, reports its memory
by location, and the planner predicts that split; impossible combinations are one line, exit 2,
before any process group."""
from __future__ import annotations

import pytest

from tests.trainer.conftest import run_trainer
from shardbench.trainer import rules
from shardbench.trainer.config import RunConfig
from shardbench.trainer.plan.inputs import PlanInput

COMMON = ["--model", "tiny", "--seq-len", "32", "--global-batch", "8", "--steps", "4", "--warmup-steps", "1",
          "--precision", "fp32", "--seed", "7", "--lr", "1e-3", "--lr-warmup-steps", "2", "--device", "cpu"]
ROWS = {  # name: trainer flags at 2 ranks (torchrun: the quickest start-up here)
    "zero2-offload": ["--strategy", "zero2", "--offload", "optimizer"],
    "zero3-offload-optimizer": ["--strategy", "zero3", "--offload", "optimizer"],
    "zero3-offload": ["--strategy", "zero3", "--offload", "params"],
    "fsdp-offload": ["--strategy", "fsdp", "--offload", "params"],
    "zero3-hpz": ["--strategy", "zero3", "--zero-hpz-partition-size", "2"],
}
OFFLOADED = {  # host bytes rank 0 counted at 2 ranks (tiny, fp32: a partition p = 1,263,360 elements)
    "zero2-offload": 20_213_760,            # fp32 grads 4p + master 4p + moments 8p
    "zero3-offload-optimizer": 25_267_200,  # + ZeRO-3's own gradient partition 4p beside the master's .grad
    "zero3-offload": 30_320_640,            # + the parameter partition 4p
    "fsdp-offload": 20_213_760,             # fp32 params, grads and moments of its shard
}
TOLERANCE = 1e-5
"""fp32 on CPU: the layouts differ from one process only in summation order (reductions over 2
ranks, DeepSpeed's flat partitions); measured here up to 9.5e-7 (one process's own rounding)."""


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    run = run_trainer(["--strategy", "ddp", "--micro-batch", "8", *COMMON], tmp_path_factory.mktemp("one"))
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record


@pytest.mark.slow
@pytest.mark.parametrize("row", list(ROWS))
def test_offload_and_hpz_rows_train_to_one_process_losses(one_process, row, tmp_path):
    run = run_trainer([*ROWS[row], "--micro-batch", "4", *COMMON], tmp_path, launcher="torchrun", nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    diffs = [abs(a - b) for a, b in zip(r["loss_per_step"], one_process["loss_per_step"])]
    assert len(diffs) == 4 and max(diffs) <= TOLERANCE, diffs
    for rank in r["model_state"]:  # memory by where it lives, the parts adding up
        assert rank["device_bytes"] + rank["host_bytes"] == rank["total_bytes"]
        assert (rank["host_bytes"] > 0) == (row != "zero3-hpz"), rank
    if row in OFFLOADED:  # the planner's split is the counted one (CPU: by kind), ZeRO-3's doubled grads too
        from shardbench.trainer.plan.predict import predict

        plan = predict(PlanInput.from_record(r))
        host = max(s["host_bytes"] for s in r["model_state"])
        assert plan["memory_by_location"]["host"] == host == OFFLOADED[row], (row, host)


@pytest.mark.slow
def test_hpz_at_four_ranks_keeps_a_secondary_partition_and_one_process_losses(one_process, tmp_path):
    """hpZ 2 of 4 ranks (2 of 2 is plain ZeRO-3): the same losses, and each rank holds the secondary
    copy of the blocks' parameters (1/2 of them) beside its primary quarter, as the planner says."""
    from shardbench.trainer.plan import formulas

    run = run_trainer(["--strategy", "zero3", "--zero-hpz-partition-size", "2", "--micro-batch", "2", *COMMON],
                      tmp_path, launcher="torchrun", nproc=4)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    diffs = [abs(a - b) for a, b in zip(r["loss_per_step"], one_process["loss_per_step"])]
    assert len(diffs) == 4 and max(diffs) <= TOLERANCE, diffs
    inp = PlanInput.from_record(r)
    assert inp.zero_hpz_partition_size == 2
    off = {**r, "settings": {**r["settings"], "zero_hpz_partition_size": 1}}
    plain = formulas.model_state(PlanInput.from_record(off))
    assert r["model_state"][0]["params_bytes"] == formulas.model_state(inp)["params"] > plain["params"]


@pytest.mark.parametrize("flags,said", [
    (["--strategy", "ddp", "--offload", "optimizer"], "ddp cannot keep optimizer in host memory (offload)"),
    (["--strategy", "zero2", "--offload", "params"], "DeepSpeed offloads parameters at ZeRO stage 3 only"),
    (["--strategy", "fsdp", "--offload", "optimizer"], "use --offload params"),
    (["--strategy", "zero2", "--zero-hpz-partition-size", "2"], "applies to ZeRO stage 3"),
    (["--strategy", "zero3", "--zero-quantized-weights"], "needs a CUDA GPU"),
    (["--strategy", "zero3", "--zero-quantized-gradients"], "needs a CUDA GPU"),
])
def test_impossible_placements_are_one_line_before_any_process_group(flags, said, tmp_path):
    run = run_trainer([*flags, "--seq-len", "16", "--steps", "2", "--warmup-steps", "1", "--device", "cpu"], tmp_path)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and said in errors[0], run.stderr[-2000:]
    assert "Traceback" not in run.stderr


def test_quantized_zeropp_is_refused_where_auto_resolves_to_cpu():
    """--device auto is known only in the trainer: rules.device_error is its rule there."""
    cfg = RunConfig(strategy="zero3", zero_quantized_gradients=True)
    assert rules.validate(cfg, 2) == []
    assert "needs a CUDA GPU" in rules.device_error(cfg, "cpu") and rules.device_error(cfg, "cuda") is None


OFFLOADED_BF16 = {  # the same, --precision bf16 (measured once, 2 ranks on CPU, 3 steps)
    "zero2-offload": 20_213_760,            # the host's partitions are fp32 whatever the precision
    "zero3-offload-optimizer": 22_740_480,  # ZeRO-3's own gradient partition in bf16: 2p
    "zero3-offload": 25_267_200,            # + bf16 parameters 2p
}


@pytest.mark.parametrize("row,precision", [(r, "fp32") for r in OFFLOADED] + [(r, "bf16") for r in OFFLOADED_BF16])
def test_the_planned_host_bytes_are_the_counted_ones(row, precision):
    """The rows' recorded host bytes (the slow test above asserts fp32's on real runs) are the
    plan's, exactly: ZeRO-3 offload holds its gradient partition twice, the second in the weights'
    dtype (was planned once: 5 MB short in fp32)."""
    from shardbench.trainer.plan.predict import predict

    flags = dict(zip(ROWS[row][::2], ROWS[row][1::2]))
    inp = PlanInput(strategy=flags["--strategy"], offload=flags["--offload"], world_size=2, seq_len=32,
                    micro_batch=4, precision=precision)
    counted = (OFFLOADED if precision == "fp32" else OFFLOADED_BF16)[row]
    assert predict(inp)["memory_by_location"]["host"] == counted


def test_the_declaration_places_state_by_attributes():
    from shardbench.trainer import contract

    z2 = contract.state_layout("zero2", "optimizer")
    assert z2.on_host == ("grads", "optimizer")  # ZeRO-Offload steps from an fp32 gradient partition there
    assert z2.model_state_bytes_by_location("bf16", 2) == {"device": 2.0, "host": (4 + 12) / 2}
    assert contract.state_layout("fsdp", "params").model_state_bytes_by_location("fp32", 4) == {"device": 0.0,
                                                                                                "host": 4.0}
    assert contract.state_layout("zero3", "none").on_host == ()


def test_fsdp_offload_with_tp_or_pp_is_refused_by_the_trainer_and_the_matrix(tmp_path):
    """FSDP2's CPUOffloadPolicy on a tensor-parallel or pipeline mesh is neither measured nor
    planned: one line and exit 2 from the trainer (2 ranks, before any process group) and the same
    line from the matrix's rules."""
    from shardbench.suite.matrix.expand import MatrixSpec, expand

    import subprocess
    import sys

    from tests.trainer.conftest import REPO, cpu_env

    env = {**cpu_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # rank 0 of 2 as torchrun starts it (no peer needed)
    run = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "fsdp", "--offload", "params",
                          "--pp", "2", "--no-tie-embeddings", "--grad-accum", "2", "--seq-len", "16", "--steps", "2",
                          "--warmup-steps", "1", "--device", "cpu", "--output-dir", str(tmp_path)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1, run.stderr[-2000:]
    assert "not supported with --pp 2" in errors[0] and "Traceback" not in run.stderr
    for degrees in ({"tp": 2}, {"pp": 2, "tie_embeddings": False, "grad_accum": 2}):
        _, why = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[4], steps=2, warmup_steps=1, offload="params",
                                   **degrees))
        said = "not supported with " + ("tp 2" if "tp" in degrees else "pp 2")  # the matrix's wording of --tp
        assert len(why) == 1 and said in why[0], why
        assert rules.validate(RunConfig(strategy="fsdp", **degrees), 4) == []  # the mesh alone is fine
