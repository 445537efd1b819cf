"""The planner (trainer/plan): its closed forms against torch's own trace (fake tensors + fake
process group), DeepSpeed's estimators reproduced, and `shardbench plan`'s bad input."""
from __future__ import annotations

import json

import pytest

from shardbench.trainer.plan import formulas
from shardbench.trainer.plan.inputs import Params, PlanInput
from shardbench.trainer.presets import PRESETS

SMALL = dict(model="tiny", seq_len=32, micro_batch=1)


@pytest.mark.parametrize("params,gpus,nodes", [(125_000_000, 8, 1), (1_300_000_000, 8, 4), (2_526_720, 2, 1)])
def test_deepspeed_estimators_reproduced(params, gpus, nodes):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    assert formulas.deepspeed_estimate(2, params, gpus_per_node=gpus, nodes=nodes) == \
        estimate_zero2_model_states_mem_needs(params, num_gpus_per_node=gpus, num_nodes=nodes, cpu_offload=False)
    largest = params // 20
    assert formulas.deepspeed_estimate(3, params, largest, gpus_per_node=gpus, nodes=nodes) == \
        estimate_zero3_model_states_mem_needs(params, largest, num_gpus_per_node=gpus, num_nodes=nodes,
                                              cpu_offload=False, cpu_offload_params=False)


@pytest.mark.parametrize("world", [1, 8, 64])
def test_model_state_relates_to_deepspeeds_estimate(world):
    """In bf16 both count 2 B/param of whole 16-bit weights for ZeRO-2; DeepSpeed's 18 B/param
    partitioned (16-bit and fp32 gradients, fp32 master, two moments) are 14 B/param partitioned
    in DeepSpeed 0.19 as the trainer runs it (gradients reduced into a 16-bit partition, no fp32
    copy: 2 + 4 + 8), 16 B/param for ZeRO-3 (+ its 16-bit weight partition); ZeRO-3's estimate
    also adds the largest layer gathered, which is not held between uses (docs/planner.md)."""
    cfg = PRESETS["gpt2-1.3b"]
    P = Params.of(cfg).total
    largest = cfg.vocab_size * cfg.n_embd
    z2 = sum(formulas.model_state(PlanInput("zero2", world, "gpt2-1.3b", precision="bf16")).values())
    z3 = sum(formulas.model_state(PlanInput("zero3", world, "gpt2-1.3b", precision="bf16")).values())
    _, ds2 = formulas.deepspeed_estimate(2, P, gpus_per_node=world)
    _, ds3, largest_bytes = formulas.deepspeed_estimate(3, P, largest, gpus_per_node=world)
    part = -(-P // world)
    assert z2 == pytest.approx(ds2 - int(18 * P / world) + 14 * part, rel=1e-6)
    assert z3 == pytest.approx(ds3 - largest_bytes - int(18 * P / world) + 16 * part, rel=1e-6)


def test_contract_bytes_per_param_agree_with_the_planner():
    for strategy in ("ddp", "fsdp", "zero1", "zero2", "zero3"):
        for precision in ("fp32", "bf16"):
            for world, accum in ((1, 1), (4, 1), (4, 4)):
                inp = PlanInput(strategy, world, "gpt2-124m", precision=precision, grad_accum=accum)
                from shardbench.trainer.contract import STRATEGIES

                expected = STRATEGIES[strategy].model_state_bytes_per_param(precision, world, accum) * Params.of(
                    inp.model_config()).total
                assert sum(formulas.model_state(inp).values()) == pytest.approx(expected, rel=0.01), inp


@pytest.mark.slow
@pytest.mark.parametrize("world,accum,sync,reshard", [(2, 1, "every_micro_step", True), (4, 2, "every_micro_step", True),
                                                      (2, 2, "last_micro_step", True), (2, 1, "every_micro_step", False)])
def test_fsdp_closed_forms_equal_the_trace(world, accum, sync, reshard):
    """FSDP's model state and collectives in closed form (used beyond TRACE_FSDP_UP_TO ranks)
    are exactly what the fake-process-group trace of FSDP2 holds and issues, with and without
    re-sharding after forward."""
    from shardbench.trainer.plan.trace import trace_step

    inp = PlanInput("fsdp", world, grad_accum=accum, fsdp_grad_sync=sync, reshard_after_forward=reshard, **SMALL)
    t = trace_step(inp)
    state = formulas.model_state(inp)
    assert (t.params_bytes, t.grads_bytes, t.optimizer_bytes) == (state["params"], state["grads"], state["optimizer"])
    closed = formulas.comm(inp)
    for op in ("all_gather", "reduce_scatter"):
        assert t.comm[op] == closed[op], op
    assert t.comm["all_reduce"]["calls"] == closed["all_reduce"]["calls"]


def test_the_parameter_table_is_the_models():
    """Params.of (the closed forms' parameter list: names, shapes, registration order) is the
    trainer's TinyGPT's, the tied embedding once (it was a fused qkv after the model split it)."""
    import torch

    from shardbench.trainer.model import TinyGPT

    for cfg in (PRESETS["tiny"], PRESETS["gpt2-124m"]):
        with torch.device("meta"):
            model = TinyGPT(cfg)
        assert Params.of(cfg).shapes == [(n, tuple(p.shape)) for n, p in model.named_parameters()]


def test_fsdp_no_reshard_after_forward_gathers_each_block_once():
    """--no-reshard-after-forward is honoured for FSDP: the trace gathers each block once per
    micro-step (it ignored the flag: +17% all-gather bytes against the run)."""
    from shardbench.trainer.plan.predict import predict

    on, off = (predict(PlanInput("fsdp", 2, reshard_after_forward=r, **SMALL))["comm_per_step"]["all_gather"]
               for r in (True, False))
    L = PRESETS["tiny"].n_layer
    assert (on["calls"], off["calls"]) == (2 * L, L + 1)
    assert off["bytes"] < on["bytes"]


def test_ddp_buckets_follow_torchs_assignment():
    """DDP's all-reduce calls per step = its bucket count (torch's own assignment, 1 MiB then
    25 MiB, parameters in reverse order)."""
    import torch
    import torch.distributed as dist

    for preset in ("tiny", "gpt2-124m"):
        params = Params.of(PRESETS[preset])
        tensors = [torch.empty(shape, device="meta") for _, shape in reversed(params.shapes)]
        buckets, _ = dist._compute_bucket_assignment_by_size(
            tensors, [formulas.DDP_FIRST_BUCKET, formulas.DDP_BUCKET], [False] * len(tensors))
        assert formulas.ddp_bucket_count(params) == len(buckets), preset


@pytest.mark.slow
def test_plan_cli_json_and_fit(capsys):
    """gpt2-1.3b on one 24 GiB A10 in bf16: DDP (16 B/param = 21 GiB of state, plus activations)
    does not fit, ZeRO-3 at 64 GPUs does."""
    from shardbench.suite.cli import main

    assert main(["plan", "--shape", "a10", "--model", "gpt2-1.3b", "--seq-len", "512", "--micro-batch", "1",
                 "--strategy", "ddp,zero3", "--world-size", "64", "--json"]) == 0
    preds = {p["input"]["strategy"]: p for p in json.loads(capsys.readouterr().out)}
    assert preds["ddp"]["fits"] is False and preds["zero3"]["fits"] is True
    assert preds["ddp"]["step_time"]["seconds"] > 0


@pytest.mark.slow
def test_1024_rank_plan_of_gpt2_1_3b():
    """Every strategy at 1024 GPUs of values/h100.yaml: two fake-tensor traces (DDP's, shared by
    FSDP beyond tracing, and ZeRO's bf16 model) and the closed forms. The time is printed (a
    benchmark, never asserted: this machine is shared); ~7 s here when idle, ~60 s under load."""
    import time

    from shardbench.trainer.plan.predict import predict
    from shardbench.suite.plan_cmd import shape_context

    _, mem, links = shape_context("h100")
    t0 = time.perf_counter()
    preds = {s: predict(PlanInput(s, 1024, "gpt2-1.3b", seq_len=2048, micro_batch=4, precision="bf16",
                                  device="cuda"), mem, links)
             for s in ("ddp", "fsdp", "zero1", "zero2", "zero3")}
    print(f"1024-rank plan of gpt2-1.3b, five strategies: {time.perf_counter() - t0:.1f} s")
    P = Params.of(PRESETS["gpt2-1.3b"]).total
    assert preds["ddp"]["model_state_bytes"] == 16 * P
    assert preds["fsdp"]["model_state_bytes"] == pytest.approx(16 * P / 1024, rel=0.05)  # padding of small params
    assert preds["zero3"]["model_state_bytes"] == pytest.approx(16 * P / 1024, rel=0.01)
    assert all(p["fits"] is True and p["step_time"]["seconds"] > 0 for p in preds.values())
    assert preds["ddp"]["peak_bytes"] > preds["zero3"]["peak_bytes"]


@pytest.mark.slow
def test_extrapolation_covers_every_gpu_shape_at_8_to_1024_gpus():
    from shardbench.suite.matrix import values_dir
    from shardbench.suite.plan_cmd import EXTRAPOLATE_WORLDS, extrapolation

    text = "\n".join(extrapolation(["zero3"]))
    gpu_shapes = [p.stem for p in values_dir().glob("*.yaml") if p.stem != "cpu"]
    assert gpu_shapes
    for shape in gpu_shapes:
        section = text.split(f"## {shape}:", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("zero3 | ")]
        assert [int(r.split(" | ")[1]) for r in rows] == list(EXTRAPOLATE_WORLDS), shape
        assert "Assumptions:" in section and "links: intra-node" in section and "allocator overhead" in section


def test_cpu_step_time_takes_gloos_measured_links_and_the_shared_machine():
    """values/cpu.yaml's measured figures reach the model: per-op busbw for gloo's all-gather
    (slower than its all-reduce), the measured alpha, and compute slowed when 2 ranks share the
    machine (not at 1 rank, not on a GPU)."""
    from shardbench.suite.plan_cmd import shape_context
    from shardbench.trainer.plan.timing import step_time

    _, _, links = shape_context("cpu")
    op_bw, slow = links["op_busbw_GBps"]["all_gather"], links["cpu_shared_slowdown"]
    assert op_bw < links["intra_node_GBps"] and slow > 1
    cal = {"achieved_flops": 1e9}
    gather = {"all_gather": {"calls": 3.0, "bytes": 1e8}}
    two = step_time(PlanInput("fsdp", world_size=2), gather, links, cal)
    one = step_time(PlanInput("fsdp", world_size=1), {}, links, cal)
    assert two["comm_s"] == pytest.approx(3 * links["alpha_us"] * 1e-6 + 1e8 * 0.5 / (op_bw * 1e9))
    assert two["compute_s"] == pytest.approx(one["compute_s"] * slow)
    gpu = step_time(PlanInput("fsdp", world_size=2, device="cuda"), gather, links, cal)
    assert gpu["compute_s"] == pytest.approx(one["compute_s"])
