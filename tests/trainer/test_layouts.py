"""Layouts beyond data parallelism (issue 28): TinyGPT with separate q/k/v trains to the fused
model's numbers; HSDP, tensor parallelism (+ sequence parallel, vocabulary-parallel loss), 2-D
FSDP + TP and DDP + TP train the same tokens to the same loss and gradient norm as one process;
impossible degrees are one line and exit 2 in the trainer and the matrix; the record carries the
layout and every rank's mesh coordinates; the layouts matrix expands to its five layouts."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, cpu_env, run_trainer
from tests.trainer.test_strategies import COMMON, reference  # its runs: 8 sequences per step, 6 steps
from shardbench.trainer.config import RunConfig

# Recorded at world size 1 (micro-batch 4, grad-accum 2) with the fused-qkv TinyGPT of commit
# 40aca72, before q, k and v were split: (loss per step, gradient norm per step).
OLD = {
    "ddp": ([9.538299560546875, 9.453372955322266, 9.342321395874023, 9.362028121948242, 9.38119888305664, 9.34618854522705],
            [1.996125340461731, 1.8229141235351562, 1.7261614799499512, 1.4150848388671875, 1.3783684968948364, 1.415234088897705]),
    "fsdp": ([9.538299560546875, 9.453372955322266, 9.342321395874023, 9.362028121948242, 9.38119888305664, 9.34618854522705],
             [1.996125340461731, 1.8229141235351562, 1.7261614799499512, 1.4150848388671875, 1.3783684968948364, 1.415234088897705]),
    "zero1": ([9.538299560546875, 9.453372955322266, 9.342321395874023, 9.362027168273926, 9.381200790405273, 9.34618854522705],
              [1.9962525367736816, 1.8232734203338623, 1.7271232604980469, 1.415849208831787, 1.3791061639785767, 1.415842056274414]),
    "zero2": ([9.538299560546875, 9.453372955322266, 9.342321395874023, 9.362027168273926, 9.381200790405273, 9.34618854522705],
              [1.9962525367736816, 1.8232734203338623, 1.7271232604980469, 1.415849208831787, 1.3791061639785767, 1.415842056274414]),
    "zero3": ([9.538299560546875, 9.453372955322266, 9.342321395874023, 9.362027168273926, 9.381200790405273, 9.34618854522705],
              [1.9962523665016472, 1.823273573362593, 1.7271232087087522, 1.4158492611237163, 1.379106029310233, 1.4158419582926787]),
}
# The fused model, in-process: one forward and backward of 4 rows of step 0 (seed 7).
OLD_ONE_STEP = {"loss": 9.553335189819336, "grad_norm": 2.4026801586151123, "wte_sum": -12.717992815295581}
ULP = 1.2e-7
"""float32's relative spacing (2^-23): splitting one matmul into three reorders sums."""


def test_separate_qkv_draws_the_fused_weights_and_gives_its_loss():
    import torch

    from shardbench.trainer.data import row_tokens
    from shardbench.trainer.model import PRESETS, TinyGPT

    torch.manual_seed(7)
    model = TinyGPT(PRESETS["tiny"])
    rows = torch.stack([row_tokens(7, 0, i, 64, 16384) for i in range(4)])
    _, loss = model(rows[:, :-1].contiguous(), rows[:, 1:].contiguous())
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert loss.item() == OLD_ONE_STEP["loss"]
    assert norm.item() == pytest.approx(OLD_ONE_STEP["grad_norm"], rel=ULP)
    # The random stream after q, k, v is the fused model's: the embedding drawn first, the
    # head (tied) last, both identical.
    assert model.wte.weight.double().sum().item() == OLD_ONE_STEP["wte_sum"]
    assert model.lm_head.weight is model.wte.weight
    assert not any("qkv" in name for name, _ in model.named_parameters())


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(OLD))
def test_every_strategy_trains_to_the_fused_models_numbers(strategy):
    run = reference(strategy, 1)  # ["--strategy", strategy, "--micro-batch", "4", *COMMON], shared
    assert run.returncode == 0, run.stderr[-3000:]
    losses, norms = OLD[strategy]
    r = run.record
    for step, (new, old) in enumerate(zip(r["loss_per_step"], losses)):
        assert abs(new - old) <= ULP * old, (step, new, old)  # one float32 ulp at 9.4
    for step, (new, old) in enumerate(zip(r["grad_norm_per_step"], norms)):
        assert abs(new - old) <= 2.5e-7, (step, new, old)  # two float32 ulps at 1.4-2.0
    assert r["layout"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}


# --- loss parity of the layouts ------------------------------------------------------------------

LAYOUTS = {
    # name: (ranks, strategy, degree flags, expected layout)
    "hsdp-2": (2, "fsdp", ["--dp-replicate", "2"], {"dp_replicate": 2, "dp_shard": 1, "tp": 1}),
    "tp-2": (2, "ddp", ["--tp", "2"], {"dp_replicate": 1, "dp_shard": 1, "tp": 2}),
    "fsdp+tp-2": (2, "fsdp", ["--tp", "2"], {"dp_replicate": 1, "dp_shard": 1, "tp": 2}),
    "hsdp-2x2": (4, "fsdp", ["--dp-replicate", "2"], {"dp_replicate": 2, "dp_shard": 2, "tp": 1}),
    "tp-4": (4, "ddp", ["--tp", "4"], {"dp_replicate": 1, "dp_shard": 1, "tp": 4}),
    "fsdp+tp-2x2": (4, "fsdp", ["--tp", "2"], {"dp_replicate": 1, "dp_shard": 2, "tp": 2}),
    "ddp+tp-2x2": (4, "ddp", ["--tp", "2"], {"dp_replicate": 2, "dp_shard": 1, "tp": 2}),
}
LOSS_TOL = 1e-5
GRAD_NORM_TOL = 1e-5


@pytest.fixture(scope="module")
def one_process() -> dict:
    run = reference("ddp", 1)  # ["--strategy", "ddp", "--micro-batch", "4", *COMMON], shared
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_trains_to_one_process_loss_and_grad_norm(tmp_path, one_process, name):
    ranks, strategy, flags, layout = LAYOUTS[name]
    micro = 8 // (ranks // layout["tp"]) // 2  # grad-accum 2 whatever the data-parallel degree
    run = run_trainer(["--strategy", strategy, "--micro-batch", str(micro), *flags, *COMMON], tmp_path,
                      launcher="torchrun", nproc=ranks)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    assert r["status"] == "ok" and {k: r["layout"][k] for k in layout} == layout
    assert r["layout"].get("pp", 1) == 1  # pipeline stages: a dimension of its own (trainer/parallel/pp.py)
    assert r["global_batch"] == 8 and r["grad_accum"] == 2
    for step, (got, want) in enumerate(zip(r["loss_per_step"], one_process["loss_per_step"], strict=True)):
        assert abs(got - want) <= LOSS_TOL, (step, got, want)
    # The one-process ddp run's norm is torch's float32 norm kernel, which on CPU loses 3e-4 of
    # the tied embedding gradient's norm (6e-5 to 6e-4 of the total here); the mesh path sums
    # the shards' squares in float64. So the norm is held to the accurate one-process norm
    # (DeepSpeed's zero1 at one rank, recorded above) within 1e-5, and to the float32 one within
    # the suite's loss-check tolerance.
    for step, got in enumerate(r["grad_norm_per_step"]):
        assert abs(got - OLD["zero1"][1][step]) <= GRAD_NORM_TOL, (step, got, OLD["zero1"][1][step])
        assert got == pytest.approx(one_process["grad_norm_per_step"][step], rel=1e-3)
    print(f"PARITY {name}: max |loss - one process| "
          f"{max(abs(g - w) for g, w in zip(r['loss_per_step'], one_process['loss_per_step'])):.2e}, "
          f"max |grad norm - accurate one process| "
          f"{max(abs(g - w) for g, w in zip(r['grad_norm_per_step'], OLD['zero1'][1])):.2e}")
    check_comm_by_dim(r, name, layout)
    check_prediction(r, name)
    coords = r["mesh_coords"]
    assert [c["rank"] for c in coords] == list(range(ranks))
    assert [c["local_rank"] for c in coords] == list(range(ranks))  # one host here
    tp = layout["tp"]
    assert [c["tp"] for c in coords] == [rank % tp for rank in range(ranks)]
    assert all(c["dp_replicate"] * layout["dp_shard"] + c["dp_shard"] == rank // tp for rank, c in enumerate(coords))


def check_comm_by_dim(r: dict, name: str, layout: dict) -> None:
    """Rank 0's collectives per mesh dimension add up to its per-op counts and equal, call for
    call and byte for byte, the layout's closed form (trainer/plan/mesh_forms.py comm_by_dim): TP's
    activation all-gathers, reduce-scatters and all-reduces on tp, the data-parallel gradient
    ones on dp_shard / dp_replicate."""
    from shardbench.trainer.plan import mesh_forms as mesh
    from shardbench.trainer.plan.inputs import PlanInput

    by_dim, per_op = r["comm_per_step_by_dim"], r["comm_per_step"]
    for op, counted in per_op.items():
        assert sum(d.get(op, {}).get("calls", 0) for d in by_dim.values()) == counted["calls"], op
        assert sum(d.get(op, {}).get("bytes", 0) for d in by_dim.values()) == counted["bytes"], op
    assert set(by_dim) <= {"dp_replicate", "dp_shard", "tp"}, by_dim  # nothing on the world group
    inp = PlanInput.from_record(r)
    assert by_dim == mesh.comm_by_dim(inp), (name, by_dim, mesh.comm_by_dim(inp))
    if layout["tp"] > 1:  # activations: sequence gathers and scatters, the loss's reductions
        assert {"all_gather", "reduce_scatter", "all_reduce"} <= set(by_dim["tp"])
    if name.startswith("ddp+tp"):  # one all-reduce of every local gradient per step (no_sync before)
        assert by_dim["dp_replicate"]["all_reduce"]["bytes"] == r["model_state"][0]["params_bytes"]


def check_prediction(r: dict, name: str) -> None:
    """The planner on the run's own input (traced on a fake mesh, closed-form state and
    collectives): model state within 2%, tensor peak within 10%, bytes within 1%, calls exact
    (measured here: state exact, peak within 0.02%, ddp+tp 2x2 -1.8%)."""
    from shardbench.trainer.plan.accuracy import errors
    from shardbench.trainer.plan.inputs import PlanInput
    from shardbench.trainer.plan.predict import predict

    p = predict(PlanInput.from_record(r))
    e = errors(p, r)
    assert abs(e["state"]) <= 0.02 and abs(e["peak"]) <= 0.10 and abs(e["comm"]) <= 0.01, (name, e)
    assert {op: v["calls"] for op, v in p["comm_per_step"].items()} == \
        {op: v["calls"] for op, v in r["comm_per_step"].items()}, name
    assert p["comm_per_step_by_dim"] == r["comm_per_step_by_dim"], name
    assert p["memory_by_dim"] == r["memory_by_dim"], name  # what each dimension divides
    print(f"PLAN {name}: state {e['state']:+.3%} peak {e['peak']:+.3%} bytes {e['comm']:+.3%}")


@pytest.mark.slow  # over 4 s on an idle machine (the fast subset's rule)
def test_the_plan_puts_tp_inside_a_node_and_data_parallel_across_nodes():
    """Extrapolation to 2 nodes of 4 GPUs (tiny has 4 heads): the TP group's collectives on the intra-node link,
    HSDP's replica all-reduce on the inter-node one (its shards inside the node), each dimension
    over its own group's ranks; a TP rank computes 1/tp of its data-parallel rank's work."""
    from shardbench.trainer.plan.inputs import PlanInput
    from shardbench.trainer.plan.predict import predict

    links = {"gpus_per_node": 4, "intra_node_GBps": 400, "inter_node_GBps": 400, "alpha_us": 10,
             "peak_tflops": 989, "shape": "h100"}
    tp = predict(PlanInput("fsdp", world_size=8, tp=4, seq_len=64, micro_batch=2), links=links)
    assert tp["step_time"]["link_by_dim"] == {"tp": "intra-node", "dp_shard": "inter-node (per GPU share)"}
    hsdp = predict(PlanInput("fsdp", world_size=8, dp_replicate=2, seq_len=64, micro_batch=2), links=links)
    assert hsdp["step_time"]["link_by_dim"] == {"dp_shard": "intra-node", "dp_replicate": "inter-node (per GPU share)"}
    assert set(hsdp["comm_per_step_by_dim"]["dp_replicate"]) == {"all_reduce"}
    assert hsdp["memory_by_dim"]["dp_shard"] == {"degree": 4, "divides": ["params", "grads", "optimizer"]}
    assert hsdp["memory_by_dim"]["dp_replicate"] == {"degree": 2, "divides": []}
    plain = predict(PlanInput("fsdp", world_size=2, seq_len=64, micro_batch=2), links=links)
    assert tp["step_time"]["compute_s"] == pytest.approx(plain["step_time"]["compute_s"] / 4)


# --- bad degrees: one line, exit 2 -----------------------------------------------------------

@pytest.mark.parametrize("world, knobs, words", [
    (4, dict(strategy="fsdp", tp=3), "world size 4 is not divisible by --tp 3 x --dp-replicate 1 = 3"),
    (6, dict(strategy="ddp", tp=3), "--tp 3 does not divide the model's 4 heads"),
    (8, dict(strategy="ddp", tp=8), "--tp 8 does not divide the model's 4 heads"),
    (2, dict(strategy="zero2", tp=2), "--tp 2 is not supported with zero2"),
    (4, dict(strategy="ddp", dp_replicate=2), "--dp-replicate 2 applies to fsdp (HSDP)"),
    (4, dict(strategy="fsdp", dp_replicate=3), "world size 4 is not divisible by --tp 1 x --dp-replicate 3 = 3"),
    (4, dict(strategy="fsdp", tp=2, seq_len=63), "--tp 2 does not divide the sequence length 63"),
])
def test_impossible_degrees_are_one_line(world, knobs, words):
    from shardbench.trainer import rules

    errors = rules.validate(RunConfig(**knobs), world)
    assert len(errors) == 1 and words in errors[0], errors


def test_tp_must_divide_the_gpus_per_worker():
    from shardbench.trainer import rules

    assert rules.check_gpus_per_worker(RunConfig(strategy="ddp", tp=2), 8) is None
    said = rules.check_gpus_per_worker(RunConfig(strategy="ddp", tp=4), 6)
    assert said and "--tp 4 does not divide the 6 GPUs (ranks) per worker" in said


def test_the_trainer_refuses_impossible_degrees_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "fsdp", "--tp", "2",
                           "--model", "tiny", "--steps", "2", "--warmup-steps", "1"],
                          cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "not divisible" in line]
    assert len(lines) == 1 and "world size 1 is not divisible by --tp 2" in lines[0], proc.stderr[-2000:]


def test_the_matrix_refuses_impossible_degrees_in_one_line():
    from shardbench.suite.matrix.expand import expand
    from shardbench.suite.matrix.specs import MatrixSpec

    specs, errors = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[2], tp=[1, 4], steps=3, warmup_steps=1))
    assert specs == [] and errors == ["world size 2 is not divisible by tp 4 x dp_replicate 1 = 4: pick degrees "
                                      "whose product divides the world size"]
    specs, errors = expand(MatrixSpec(strategies=["ddp"], world_sizes=[4], tp=2, shape="cpu", max_world_size=4,
                                      steps=3, warmup_steps=1))
    assert errors == [] and len(specs) == 1


def test_the_layouts_matrix_expands_to_five_layouts_at_four_devices():
    from shardbench.suite.matrix.expand import expand, load_matrix, run_count

    m = load_matrix(REPO / "suite" / "matrices" / "layouts-4dev.yaml")
    specs, errors = expand(m)
    assert errors == []
    # (the untied rows beside the pipelines: tests/trainer/test_pipeline.py)
    got = sorted((s.strategy, s.config.tp, s.config.dp_replicate, s.config.offload, s.config.zero_hpz_partition_size)
                 for s in specs if s.repeat == 0 and s.config.tie_embeddings)
    assert got == [("ddp", 1, 1, "none", 1), ("ddp", 2, 1, "none", 1), ("fsdp", 1, 1, "none", 1),
                   ("fsdp", 1, 1, "params", 1), ("fsdp", 1, 2, "none", 1), ("fsdp", 2, 1, "none", 1),
                   ("zero2", 1, 1, "optimizer", 1), ("zero3", 1, 1, "none", 2), ("zero3", 1, 1, "params", 1)]
    assert run_count(m) == len(specs)  # with layouts: one run per entry and repeat, not the product
    assert {s.world_size for s in specs} == {4} and {s.global_batch for s in specs} == {8}


@pytest.mark.slow
def test_a_fused_qkv_checkpoint_is_refused_in_one_line(tmp_path):
    """A checkpoint saved before q, k and v were split (its resume key's model has no
    `attention`, its state dict a `qkv`) is refused with one line, not a DCP missing-key trace."""
    import hashlib
    import json

    ck = tmp_path / "ck"
    args = ["--strategy", "ddp", "--model", "tiny", "--seq-len", "32", "--warmup-steps", "1",
            "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]
    first = run_trainer([*args, "--steps", "3"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    step = ck / "step-00000002"
    state = json.loads((step / "trainer_state.json").read_text())
    del state["key"]["model"]["attention"]  # as the fused model's checkpoints were written
    data = json.dumps(state).encode()
    (step / "trainer_state.json").write_bytes(data)
    manifest = json.loads((step / "manifest.json").read_text())
    manifest["files"]["trainer_state.json"].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    (step / "manifest.json").write_text(json.dumps(manifest))
    second = run_trainer([*args, "--steps", "4", "--resume-allow", "steps"], tmp_path)
    assert second.returncode != 0
    error = second.record["error"].splitlines()[0]
    assert "holds the fused-qkv TinyGPT of an earlier shardbench" in error and "--resume never" in error


def test_the_report_compares_layouts_in_one_group_named_with_their_degrees():
    """4-device layouts at one global batch are one comparison ("same settings except the
    layout", grad-accum following the data-parallel degree) and each is named with its degrees."""
    from shardbench.suite.analyze import analysis
    from tests.synthetic import record

    made = [("ddp", 1, {}), ("fsdp", 1, {}), ("fsdp", 1, {"dp_replicate": 2}), ("fsdp", 2, {"tp": 2}),
            ("ddp", 2, {"tp": 2})]
    records = []
    for i, (strategy, accum, degrees) in enumerate(made):
        for repeat in range(3):
            records.append(record(strategy, world_size=4, micro_batch=2, grad_accum=accum, repeat=repeat,
                                  tokens_per_s=1000.0 + 10 * i + repeat, global_batch=8,
                                  config_id=f"cfg{i}", run_id=f"{strategy}-w4-cfg{i}-r{repeat}",
                                  settings={"strategy": strategy, "micro_batch": 2, **degrees}))
    an = analysis.analyze(records)
    found = analysis.verdict_groups(an.configs)
    assert len(found) == 1 and len(found[0]) == 5
    assert sorted(c.strategy for c in an.configs) == ["ddp", "ddp+tp 2x2", "fsdp", "fsdp+tp 2x2", "hsdp 2x2"]
