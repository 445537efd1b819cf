"""Pipeline parallelism (issue 29): --pp with torch.distributed.pipelining's schedules trains the
same tokens to the same loss and gradient norm as one process, alone and with fsdp, tp and ddp
on the mesh; its send/recv traffic is counted and equals the arithmetic; the stages of an untied
TinyGPT chain to the whole model exactly; impossible pipelines are one line and exit 2 before any
process group."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests.trainer.conftest import REPO, cpu_env, run_trainer
from shardbench.trainer.config import RunConfig

STEPS = 4
N_LAYER, SEQ, D = 4, 64, 128
COMMON = ["--model", "tiny", "--n-layer", str(N_LAYER), "--seq-len", str(SEQ), "--global-batch", "8",
          "--steps", str(STEPS), "--warmup-steps", "1", "--precision", "fp32", "--seed", "7", "--lr", "1e-3",
          "--lr-warmup-steps", "2", "--no-tie-embeddings"]
# DeepSpeed's zero1 at one rank, micro-batch 4 (commit d87aa2e): the accurate one-process norm
# (the ddp run's float32 norm kernel is up to 1e-3 off here; see DEVELOPERS.md "Layouts on a mesh").
ACCURATE_NORM = [3.121335506439209, 2.6276729106903076, 1.7311279773712158, 1.2861742973327637]
TOL = 1e-5

PIPELINES = {
    # name: (ranks, strategy, flags, micro-batch, expected layout)
    "gpipe-2": (2, "ddp", ["--pp", "2", "--pp-schedule", "GPipe"], 2,
                {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}),
    "interleaved1f1b-2": (2, "fsdp", ["--pp", "2", "--pp-schedule", "Interleaved1F1B"], 2,
                          {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}),
    "zbv-2": (2, "ddp", ["--pp", "2", "--pp-schedule", "ZBVZeroBubble"], 2,
              {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 1}),
    "pp+fsdp-2x2": (4, "fsdp", ["--pp", "2", "--pp-schedule", "1F1B"], 2,
                    {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 1}),
    "pp+tp-2x2": (4, "ddp", ["--pp", "2", "--tp", "2", "--pp-schedule", "DualPipeV"], 2,
                  {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "tp": 2}),
    "pp+ddp-2x2": (4, "ddp", ["--pp", "2", "--pp-schedule", "LoopedBFS"], 1,
                   {"pp": 2, "dp_replicate": 2, "dp_shard": 1, "tp": 1}),
}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> dict:
    run = run_trainer(["--strategy", "ddp", "--micro-batch", "4", *COMMON], tmp_path_factory.mktemp("one"))
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record


def stage_owners(schedule: str, pp: int, per_rank: int) -> dict[int, int]:
    """Stage -> the pipeline rank holding it."""
    from shardbench.trainer.parallel.layout import pp_stage_ids

    return {s: r for r in range(pp) for s in pp_stage_ids(schedule, pp, per_rank, r)}


def p2p_expected(schedule: str, pp: int, per_rank: int, pp_rank: int, micro_batches: int,
                 activation_bytes: int) -> tuple[int, int]:
    """(calls, bytes) each of send and recv per step on pipeline rank `pp_rank`: per micro-batch,
    every stage boundary this rank's stages share with a stage on another rank carries one
    activation forward and its gradient back (the first stage's input, tokens, has none)."""
    from shardbench.trainer.parallel.layout import pp_stage_ids

    n_stages, owner = pp * per_rank, stage_owners(schedule, pp, per_rank)
    mine = pp_stage_ids(schedule, pp, per_rank, pp_rank)
    crossings = sum(1 for s in mine for nb in (s - 1, s + 1) if 0 <= nb < n_stages and owner[nb] != pp_rank)
    return crossings * micro_batches, crossings * micro_batches * activation_bytes


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PIPELINES))
def test_pipeline_trains_to_one_process_loss_and_grad_norm(tmp_path, one_process, name):
    ranks, strategy, flags, micro, layout = PIPELINES[name]
    run = run_trainer(["--strategy", strategy, "--micro-batch", str(micro), *flags, *COMMON], tmp_path,
                      launcher="torchrun", nproc=ranks)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    assert r["status"] == "ok" and r["layout"] == layout and r["global_batch"] == 8
    assert r["model"]["tie_embeddings"] is False
    if strategy == "fsdp":  # PipelineStage reduce-scatters once per step, whatever the knob says
        assert r["fsdp_grad_sync"] == "last_micro_step"
    loss_diff = [abs(g - w) for g, w in zip(r["loss_per_step"], one_process["loss_per_step"], strict=True)]
    norm_diff = [abs(g - w) for g, w in zip(r["grad_norm_per_step"], ACCURATE_NORM, strict=True)]
    print(f"PARITY {name}: max |loss - one process| {max(loss_diff):.2e}, "
          f"max |grad norm - accurate one process| {max(norm_diff):.2e}")
    assert max(loss_diff) <= TOL, (r["loss_per_step"], one_process["loss_per_step"])
    assert max(norm_diff) <= TOL, (r["grad_norm_per_step"], ACCURATE_NORM)
    # Every pipeline rank's point-to-point traffic (the record's `pipeline`) is the arithmetic
    # of its stages' boundaries; rank 0's is also its per-dimension counters' "pp".
    from shardbench.trainer.parallel.layout import pp_stage_ids, pp_stages_per_rank

    schedule = flags[flags.index("--pp-schedule") + 1]
    per_rank, n_micro = pp_stages_per_rank(schedule, None), r["grad_accum"]
    activation = micro * (SEQ // layout["tp"]) * D * 4  # fp32 (B, T / tp, d): sequence-parallel under TP
    pipe = r["pipeline"]
    assert (pipe["schedule"], pipe["stages"], pipe["stages_per_rank"]) == (schedule, 2 * per_rank, per_rank)
    assert [p["pp_rank"] for p in pipe["p2p_per_step"]] == list(range(layout["pp"]))
    for p in pipe["p2p_per_step"]:
        calls, nbytes = p2p_expected(schedule, layout["pp"], per_rank, p["pp_rank"], n_micro, activation)
        assert p["stages"] == pp_stage_ids(schedule, layout["pp"], per_rank, p["pp_rank"])
        assert p["send"] == p["recv"] == {"calls": calls, "bytes": nbytes}, p
    # In all: each of the stages - 1 boundaries that cross ranks carries every micro-batch's
    # activation forward and its gradient back.
    owner = stage_owners(schedule, layout["pp"], per_rank)
    crossings = sum(1 for s in range(pipe["stages"] - 1) if owner[s] != owner[s + 1])
    total = sum(p["send"]["bytes"] + p["recv"]["bytes"] for p in pipe["p2p_per_step"])
    assert total == crossings * n_micro * activation * 2 * 2  # 2 directions, each a send and a recv
    pp_traffic = r["comm_per_step_by_dim"]["pp"]
    for op in ("send", "recv"):
        assert {k: pp_traffic[op][k] for k in ("calls", "bytes")} == pipe["p2p_per_step"][0][op]
        assert r["comm_per_step"][op] == {**pp_traffic[op], "seconds": r["comm_per_step"][op]["seconds"]}
    print(f"P2P {name}: {crossings} rank-crossing boundaries x {n_micro} micro-batches x {activation} B x 2 "
          f"directions = {total // 2} B sent per step over the pipeline; rank 0 sends "
          f"{pipe['p2p_per_step'][0]['send']}")
    coords = r["mesh_coords"]
    assert [c["pp"] for c in coords] == [rank // (ranks // 2) for rank in range(ranks)]
    # The planner on the same run (no run of its own): tests/trainer/test_plan_pipeline.py
    from tests.trainer.test_plan_pipeline import check_plan_against

    check_plan_against(r, name)


# --- in-process: the stages are the model ------------------------------------------------------

def test_untied_stages_chain_to_the_whole_model_exactly():
    import torch

    from shardbench.trainer.model import TinyGPT, count_params
    from shardbench.trainer.parallel.layout import pp_layer_bounds

    cfg = RunConfig(strategy="ddp", n_layer=N_LAYER, tie_embeddings=False).model_config()
    torch.manual_seed(7)
    model = TinyGPT(cfg)
    assert model.lm_head.weight is not model.wte.weight
    assert count_params(model) == cfg.n_params()
    x = torch.randint(0, cfg.vocab_size, (2, SEQ))
    bounds = pp_layer_bounds(N_LAYER, 4)
    assert bounds == [(0, 1), (1, 2), (2, 3), (3, 4)]
    h = x
    for i, (first, last) in enumerate(bounds):
        h = model.stage(first, last, embed=i == 0, head=i == 3)(h)
    assert torch.equal(h, model(x))
    assert pp_layer_bounds(5, 2) == [(0, 3), (3, 5)]


def test_an_untied_model_draws_the_tied_ones_weights_and_one_head_more():
    import torch

    from shardbench.trainer.model import TinyGPT, count_params

    tied_cfg = RunConfig(strategy="ddp").model_config()
    untied_cfg = RunConfig(strategy="ddp", tie_embeddings=False).model_config()
    torch.manual_seed(7)
    tied = TinyGPT(tied_cfg)
    torch.manual_seed(7)
    untied = TinyGPT(untied_cfg)
    assert count_params(untied) - count_params(tied) == untied_cfg.vocab_size * untied_cfg.n_embd
    assert untied_cfg.n_params() - tied_cfg.n_params() == untied_cfg.vocab_size * untied_cfg.n_embd
    assert untied_cfg.flops_params() == tied_cfg.flops_params()  # the head's matmul is counted either way
    # The head is drawn last in both (the tied model draws its shared weight again there).
    assert torch.equal(untied.lm_head.weight, tied.lm_head.weight)
    assert torch.equal(untied.blocks[0].attn.q.weight, tied.blocks[0].attn.q.weight)


def test_layout_coordinates_put_the_pipeline_outermost():
    from shardbench.trainer.parallel.layout import Layout

    cfg = RunConfig(strategy="fsdp", pp=2, tp=2, tie_embeddings=False)
    layout = Layout.of(cfg, 8)
    assert layout.degrees == {"pp": 2, "dp_replicate": 1, "dp_shard": 2, "tp": 2}
    assert [layout.coords(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    # Both stages of a pipeline take the same rows: dp rank from the inner coordinates only.
    assert [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert cfg.dp_degree(8) == 2 and layout.needs_mesh


# --- bad pipelines: one line, exit 2 -----------------------------------------------------------

UNTIED = dict(tie_embeddings=False)


@pytest.mark.parametrize("world, knobs, words", [
    (2, dict(strategy="ddp", pp=2, grad_accum=2), "--pp 2 needs an untied head (--no-tie-embeddings)"),
    (2, dict(strategy="zero2", pp=2, **UNTIED), "--pp 2 is not supported with zero2"),
    (6, dict(strategy="ddp", pp=4, grad_accum=4, **UNTIED), "world size 6 is not divisible by --pp 4 x --tp 1"),
    (4, dict(strategy="fsdp", pp=2, tp=4, **UNTIED), "world size 4 is not divisible by --pp 2 x --tp 4"),
    (4, dict(strategy="ddp", pp=4, grad_accum=4, **UNTIED), "= 4 stages is deeper than the model's 2 layers"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="ZBVZeroBubble", grad_accum=4, **UNTIED),
     "--pp 2 x 2 stage(s) per rank = 4 stages is deeper than the model's 2 layers"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="1F1B", grad_accum=1, **UNTIED),
     "--pp-schedule 1F1B needs at least --pp 2 micro-batches"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="DualPipeV", n_layer=4, grad_accum=3, **UNTIED),
     "DualPipeV needs at least as many micro-batches (--grad-accum) as stages (4), got 3"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="Interleaved1F1B", n_layer=4, grad_accum=5, **UNTIED),
     "Interleaved1F1B needs the micro-batches (--grad-accum 5) to be a multiple of their rounds (2"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="GPipe", pp_stages_per_rank=2, n_layer=4, **UNTIED),
     "--pp-schedule GPipe runs one stage per rank, not 2"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="LoopedBFS", pp_stages_per_rank=1, **UNTIED),
     "--pp-schedule LoopedBFS loops over several stages per rank"),
    (2, dict(strategy="ddp", pp=2, pp_schedule="DualPipeV", pp_stages_per_rank=3, n_layer=6, grad_accum=6,
             **UNTIED), "holds exactly 2 stages per rank in a V"),
    (2, dict(strategy="fsdp", pp=2, grad_accum=2, checkpoint_every=1, checkpoint_dir="/tmp/x", **UNTIED),
     "--pp 2 does not checkpoint yet"),
    (4, dict(strategy="ddp", pp=2, grad_accum=2, ddp_comm_hook="powersgd", **UNTIED),
     "--pp 2 with --ddp-comm-hook powersgd"),
])
def test_impossible_pipelines_are_one_line(world, knobs, words):
    from shardbench.trainer import rules

    errors = rules.validate(RunConfig(**knobs), world)
    assert len(errors) == 1 and words in errors[0], errors


@pytest.mark.parametrize("schedule, per_rank, micro", [
    ("GPipe", 1, 1), ("1F1B", 1, 2), ("Interleaved1F1B", 2, 4), ("Interleaved1F1B", 2, 3), ("LoopedBFS", 2, 1),
    ("InterleavedZeroBubble", 2, 4), ("ZBVZeroBubble", 2, 2), ("DualPipeV", 2, 4),
])
def test_possible_pipelines_pass_the_rules(schedule, per_rank, micro):
    from shardbench.trainer import rules

    cfg = RunConfig(strategy="ddp", pp=2, pp_schedule=schedule, n_layer=2 * per_rank, grad_accum=micro, **UNTIED)
    assert rules.validate(cfg, 2) == []


def test_the_trainer_refuses_an_impossible_pipeline_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--pp", "2",
                           "--model", "tiny", "--steps", "2", "--warmup-steps", "1"],
                          cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if "--pp 2" in line]
    assert len(lines) == 1 and "world size 1 is not divisible by --pp 2" in lines[0], proc.stderr[-2000:]


def test_the_matrix_refuses_an_impossible_pipeline_in_one_line():
    from shardbench.suite.matrix.expand import expand
    from shardbench.suite.matrix.specs import MatrixSpec

    specs, errors = expand(MatrixSpec(strategies=["ddp"], world_sizes=[2], pp=2, steps=3, warmup_steps=1))
    assert specs == [] and errors == ["pp 2 needs an untied head (tie_embeddings: false): the tied embedding's two "
                                      "uses would sit on the first and last stage with gradients never summed "
                                      "(silently wrong losses)"]
    specs, errors = expand(MatrixSpec(strategies=["fsdp"], world_sizes=[4], pp=[1, 4], tie_embeddings=False,
                                      steps=3, warmup_steps=1, shape="cpu", max_world_size=4))
    assert specs == [] and len(errors) == 1 and errors[0].startswith(
        "pp 4 x 1 stage(s) per rank = 4 stages is deeper than the model's 2 layers"), errors


def test_the_layouts_matrix_has_pipeline_rows_beside_untied_ddp_and_fsdp():
    from shardbench.suite.matrix.expand import expand, load_matrix

    specs, errors = expand(load_matrix(REPO / "suite" / "matrices" / "layouts-4dev.yaml"))
    assert errors == []
    untied = sorted((s.strategy, s.config.tp, s.config.pp, s.config.pp_schedule, s.grad_accum)
                    for s in specs if s.repeat == 0 and not s.config.tie_embeddings)
    assert untied == [("ddp", 1, 1, "1F1B", 1), ("ddp", 1, 2, "1F1B", 2), ("fsdp", 1, 1, "1F1B", 1),
                      ("fsdp", 1, 2, "GPipe", 2), ("fsdp", 2, 2, "1F1B", 4)]
    assert all(s.config.pp == 1 for s in specs if s.config.tie_embeddings)


def test_the_report_names_a_pipeline_after_its_mesh():
    from shardbench.suite.analyze.groups import VERDICT_EXCEPT, layout_name

    assert layout_name({"strategy": "fsdp", "world_size": 4, "pp": 2}) == "fsdp, pp 2 1F1B"
    assert layout_name({"strategy": "ddp", "world_size": 4, "pp": 2, "tp": 2, "pp_schedule": "GPipe"}) == \
        "tp 2, pp 2 GPipe"
    assert layout_name({"strategy": "ddp", "world_size": 2, "pp": 2, "pp_schedule": "ZBVZeroBubble"}) == \
        "pp 2 ZBVZeroBubble"
    assert layout_name({"strategy": "ddp", "world_size": 4}) == "ddp"
    # Schedules and degrees are the layout a verdict compares; the head's tie is the model's.
    assert {"pp", "pp_schedule", "pp_stages_per_rank"} <= VERDICT_EXCEPT and "tie_embeddings" not in VERDICT_EXCEPT


def test_the_report_compares_pipelines_with_untied_ddp_in_one_group_named_with_their_schedules():
    """The untied group of layouts-4dev: ddp beside ddp x pp 2 (1F1B), fsdp x pp 2 (GPipe) and
    tp 2 x pp 2 is one comparison, each named with its degrees and schedule."""
    from shardbench.suite.analyze import analysis
    from tests.synthetic import record

    made = [("ddp", 1, {}), ("ddp", 2, {"pp": 2}), ("fsdp", 2, {"pp": 2, "pp_schedule": "GPipe"}),
            ("fsdp", 4, {"pp": 2, "tp": 2})]
    records = []
    for i, (strategy, accum, degrees) in enumerate(made):
        for repeat in range(3):
            # fsdp's pipelines reduce-scatter once per step (the record says so; the knob says not)
            sync = {"fsdp_grad_sync": "last_micro_step"} if strategy == "fsdp" else {}
            records.append(record(strategy, world_size=4, micro_batch=2, grad_accum=accum, repeat=repeat,
                                  tokens_per_s=1000.0 + 10 * i + repeat, global_batch=8,
                                  config_id=f"cfg{i}", run_id=f"{strategy}-w4-cfg{i}-r{repeat}", **sync,
                                  settings={"strategy": strategy, "micro_batch": 2, "tie_embeddings": False,
                                            **degrees}))
    an = analysis.analyze(records)
    found = analysis.verdict_groups(an.configs)
    assert len(found) == 1 and len(found[0]) == 4
    assert sorted(c.strategy for c in an.configs) == ["ddp", "ddp, pp 2 1F1B", "fsdp, pp 2 GPipe", "tp 2, pp 2 1F1B"]


def test_a_tied_runs_resume_key_is_the_one_checkpoints_had_before_the_knob():
    """Checkpoints saved before --tie-embeddings existed still resume a tied run; an untied run's
    key differs, so it never resumes a tied checkpoint (nor the reverse)."""
    from shardbench.trainer.checkpoint import resume_key

    tied = resume_key(RunConfig(strategy="fsdp"), 2)["model"]
    assert "tie_embeddings" not in tied and tied["attention"] == "q,k,v"
    untied = resume_key(RunConfig(strategy="fsdp", tie_embeddings=False), 2)["model"]
    assert untied == {**tied, "tie_embeddings": False}


# --- the planner and the untied head -------------------------------------------------------------

def test_the_parameter_table_is_the_untied_models():
    import torch

    from shardbench.trainer.model import TinyGPT
    from shardbench.trainer.plan.inputs import Params, PlanInput

    cfg = PlanInput(strategy="ddp", tie_embeddings=False).model_config()
    assert not cfg.tie_embeddings
    with torch.device("meta"):
        model = TinyGPT(cfg)
    assert Params.of(cfg).shapes == [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    assert Params.of(cfg).total == cfg.n_params()


def test_the_planner_says_not_modelled_for_pipelines_with_tp_and_untied_tp_in_one_line():
    from shardbench.trainer.plan.inputs import PlanInput
    from shardbench.trainer.plan.planned_layout import NotModelled

    for inp, words in ((PlanInput(strategy="ddp", world_size=8, pp=2, tp=2, tie_embeddings=False),
                        "pipeline parallel (--pp 2) with tensor parallel over data-parallel ranks"),
                       (PlanInput(strategy="fsdp", world_size=2, tp=2, tie_embeddings=False),
                        "an untied head (--no-tie-embeddings) with tensor parallel (--tp)")):
        with pytest.raises(NotModelled, match=None) as said:
            inp.layout
        assert words in str(said.value) and "\n" not in str(said.value)
    PlanInput(strategy="fsdp", world_size=4, tie_embeddings=False).layout  # modelled: data parallel, untied


@pytest.mark.slow
def test_the_planner_predicts_an_untied_fsdp_run(tmp_path):
    """The untied head is one more parameter in the table: a real fsdp run at 2 ranks has the
    predicted model state and collective bytes per op exactly, its tensor peak within 5%."""
    from shardbench.trainer.plan.accuracy import errors
    from shardbench.trainer.plan.inputs import PlanInput
    from shardbench.trainer.plan.predict import predict

    run = run_trainer(["--strategy", "fsdp", "--micro-batch", "2", *COMMON[:COMMON.index("--steps")],
                       "--steps", "3", "--warmup-steps", "1", "--no-tie-embeddings"], tmp_path,
                      launcher="torchrun", nproc=2)
    assert run.returncode == 0, run.stderr[-3000:]
    r = run.record
    said = errors(predict(PlanInput.from_record(r)), r)
    print(f"PLAN untied fsdp w2: {said}")
    assert said["state"] == 0 and said["comm"] == 0 and abs(said["peak"]) <= 0.05, said
