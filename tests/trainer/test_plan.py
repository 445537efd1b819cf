"""The planner (trainer/plan): its closed forms against torch's own trace (fake tensors + fake
process group), against DeepSpeed's own estimators, and `shardbench plan`'s bad input."""
from __future__ import annotations

import json

import pytest

from shardbench.trainer.plan import formulas
from shardbench.trainer.plan.inputs import Params, PlanInput
from shardbench.trainer.presets import PRESETS

SMALL = dict(model="tiny", seq_len=32, micro_batch=1)


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
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, ds2 = estimate_zero2_model_states_mem_needs(P, num_gpus_per_node=world, cpu_offload=False)
    _, ds3, largest_bytes = estimate_zero3_model_states_mem_needs(P, largest, num_gpus_per_node=world,
                                                                  cpu_offload=False, cpu_offload_params=False)
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


DDP_HOOK_CALLS = """
import json, os, sys, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from shardbench.trainer.model import TinyGPT
from shardbench.trainer.presets import PRESETS
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
dist.init_process_group("gloo", rank=0, world_size=1)
out = {}
for cap in (25, 2, 1, 0.5, 0.1):
    model, calls = DDP(TinyGPT(PRESETS["tiny"]), bucket_cap_mb=cap), []
    def hook(state, bucket):
        calls.append(1)
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut
    model.register_comm_hook(None, hook)
    x = torch.zeros((1, 8), dtype=torch.long)
    for step in range(3):  # the buckets are rebuilt after the first backward
        calls.clear()
        model(x, x)[1].backward()
    out[cap] = len(calls)
print(json.dumps(out))
"""


@pytest.mark.slow  # a real DDP in a subprocess: ~10 s idle, minutes under load
def test_ddp_buckets_follow_torchs_own_count():
    """DDP's all-reduce calls per measured step = the comm hook's calls of a real DDP (gloo, one
    rank) in its third step, after torch has rebuilt its buckets: torch 2.13 makes 1 call for tiny
    at 25 MiB where the planner said 2 (a 1 MiB first bucket that the rebuild does not keep)."""
    import subprocess
    import sys

    from tests.trainer.conftest import free_port

    proc = subprocess.run([sys.executable, "-c", DDP_HOOK_CALLS, str(free_port())], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = {float(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    params = Params.of(PRESETS["tiny"])
    assert {cap: formulas.ddp_bucket_count(params, bucket=int(cap * 2 ** 20)) for cap in measured} == measured
    assert measured[25.0] == 1


@pytest.mark.slow
def test_plan_cli_json_and_fit(capsys):
    """gpt2-1.3b on one 24 GiB A10 in bf16: DDP (16 B/param = 21 GiB of state, plus activations)
    does not fit, ZeRO-3 at 64 GPUs does."""
    from shardbench.suite.cli.commands import main

    assert main(["plan", "--shape", "a10", "--model", "gpt2-1.3b", "--seq-len", "512", "--micro-batch", "1",
                 "--strategy", "ddp,zero3", "--world-size", "64", "--json"]) == 0
    preds = {p["input"]["strategy"]: p for p in json.loads(capsys.readouterr().out)}
    assert preds["ddp"]["fits"] is False and preds["zero3"]["fits"] is True
    assert preds["ddp"]["step_time"]["seconds"] > 0


@pytest.mark.slow  # two FSDP2 traces of gpt2-1.3b (8 and 16 fake ranks): ~1 min idle
def test_per_rank_memory_never_rises_with_the_data_parallel_degree():
    """FSDP and ZeRO-3 beyond 16 ranks: per-rank memory extrapolated from the traces' own
    scaling (replicated + sharded / N) never rises with N (the old closed form rose: gpt2-1.3b
    FSDP 21.6 GiB at 8 GPUs, 24.5 at 64, where torchtitan measures it falling)."""
    from shardbench.trainer.plan.predict import predict

    for strategy in ("fsdp", "zero3"):
        peaks = [predict(PlanInput(strategy, n, model="gpt2-1.3b", seq_len=2048, micro_batch=4, precision="bf16",
                                   device="cuda"))["peak_bytes"] for n in (8, 16, 32, 64, 128)]
        assert all(b <= a for a, b in zip(peaks, peaks[1:])), (strategy, peaks)


@pytest.mark.slow
def test_1024_rank_plan_of_gpt2_1_3b():
    """Every strategy at 1024 GPUs of values/h100.yaml: four fake-tensor traces (DDP's, FSDP2's
    at 8 and 16 ranks, whose scaling gives its peak beyond, and ZeRO's bf16 model) and the
    closed forms. The time is printed (a benchmark, never asserted: this machine is shared)."""
    import time

    from shardbench.trainer.plan.predict import predict
    from shardbench.suite.cli.plan_cmd import shape_context

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
    from shardbench.suite.matrix.expand import values_dir
    from shardbench.suite.cli.plan_cmd import EXTRAPOLATE_WORLDS, extrapolation

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
    from shardbench.suite.cli.plan_cmd import shape_context
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


def test_a_measured_zero_latency_stays_zero():
    """A pre-flight on a loaded host can measure alpha 0 (its smallest message no slower than the
    bandwidth term): the model keeps 0 and says so, where `alpha_us or 10` put the assumed 10 us
    back (the CI run of stop 37 failed on exactly this)."""
    from shardbench.trainer.plan.timing import link, step_time

    measured = {"intra_node_GBps": 1.0, "gpus_per_node": 8, "alpha_us": 0.0}
    assert link(measured, 2)[1] == 0.0 and link(measured, 16)[1] == 0.0
    assert link({"gpus_per_node": 8}, 2)[1] == pytest.approx(10e-6)   # none measured: assumed
    step = step_time(PlanInput("ddp", world_size=2), {"all_reduce": {"calls": 4.0, "bytes": 1e6}}, measured, None)
    assert step["alpha_us"] == 0.0
    assert step["comm_s"] == pytest.approx(1e6 * 1.0 / 1e9)


def test_deepspeed_buckets_are_sized_as_allocated():
    """ZeRO-1/2 allocate their two reduce buckets in the model's dtype, ZeRO-3 its one in the
    communication dtype, each sized so that it holds --bucket-mib (trainer/ds_knobs.py): 25 in
    bf16 is 2 x 25 MiB for ZeRO-2 (the planner said 2 x 50: +46.7% on a bf16 run) and 25 MiB for
    ZeRO-3 whatever it reduces in."""
    MiB = 2 ** 20
    for precision, reduce, zero2, zero3 in (("fp32", "fp32", 50, 25), ("bf16", "fp32", 50, 25), ("bf16", "bf16", 50, 25)):
        got = [formulas.buckets(PlanInput(s, 2, precision=precision, grad_reduce_dtype=reduce)) / MiB
               for s in ("zero2", "zero3")]
        assert got == pytest.approx([zero2, zero3], abs=1e-5), (precision, reduce)


def test_reduce_buckets_pack_gradients_as_deepspeed_does():
    """A model larger than one reduce bucket: one reduction per bucket flush (a gradient that
    overflows a non-empty bucket flushes it first, one larger than the bucket goes alone)."""
    params = Params([("a", (10,)), ("big", (100,)), ("b", (30,)), ("c", (30,))])  # gradients arrive c, b, big, a
    assert formulas.reduce_bucket_flushes(params, 1000) == 1
    assert formulas.reduce_bucket_flushes(params, 60) == 3   # [c, b] [big] [a]
    assert formulas.reduce_bucket_flushes(params, 50) == 4   # [c] [b] [big] [a]


def test_step_time_counts_recompute_and_states_the_shapes_mfu():
    """Activation checkpointing's recompute (each block's forward again) is in the compute time,
    and the assumed MFU is the shape's measured figure (torchtitan's, per shape; was a fixed 40%)."""
    from shardbench.suite.cli.plan_cmd import shape_context
    from shardbench.trainer.plan import timing

    _, _, links = shape_context("h100")
    inp = PlanInput("ddp", 1, model="gpt2-124m", seq_len=1024, micro_batch=4, precision="bf16", device="cuda")
    plain, ac = (timing.step_time(PlanInput(**{**inp.to_dict(), "activation_checkpointing": a}), {}, links, None)
                 for a in (False, True))
    cfg = inp.model_config()
    base = timing.flops_per_token(cfg, 1024)
    assert ac["compute_s"] / plain["compute_s"] == pytest.approx((base + timing.recompute_flops_per_token(cfg, 1024))
                                                                 / base)
    assert 1.2 < ac["compute_s"] / plain["compute_s"] < 1.34  # up to a third more: one more forward of the blocks
    assert "assumed MFU 33% (torchtitan" in plain["compute_source"] and "recompute" in ac["compute_source"]
    assert plain["compute_rate_flops"] == pytest.approx(links["peak_tflops"] * 1e12 * 0.33)


@pytest.mark.parametrize("extra,measured", [
    # (configuration, all-reduce calls per step measured by a real run of it: benchmarks/plan_accuracy_random.py)
    (dict(strategy="zero1", world_size=3, n_layer=2, n_embd=48, n_head=2, vocab_size=8192, seq_len=64,
          grad_accum=2, bucket_mib=0.5), 6),   # wte (393,216 elements) > the 131,072-element bucket
    (dict(strategy="zero2", world_size=4, n_layer=2, n_embd=96, n_head=4, vocab_size=16384, seq_len=64,
          grad_accum=2, bucket_mib=2), 8),
    (dict(strategy="zero2", world_size=3, n_layer=4, n_embd=96, n_head=4, vocab_size=512, seq_len=16,
          precision="bf16", bucket_mib=2), 4),  # bf16 model reducing in fp32: one call more
])
def test_zero12_reduce_calls_of_models_larger_than_a_bucket(extra, measured):
    """ZeRO-1/2 all-reduce a gradient larger than the bucket in pieces split at the ranks'
    partitions (average_tensor / allreduce_and_scatter), + the 2 small norm/overflow calls."""
    inp = PlanInput(**{"model": "tiny", **extra})
    assert formulas.comm(inp)["all_reduce"]["calls"] == measured


def test_zero3_casts_a_gradient_larger_than_the_bucket_to_the_comm_dtype():
    """ZeRO-3 reducing in another dtype than the model's: a gradient larger than the reduce
    bucket stays out of it and is cast whole to the communication dtype at its reduction
    (DeepSpeed 0.19.8 stage3 `__avg_scatter_grads`): comm bytes x its elements on the backward
    peak. Run 34-zero3-w4 of the random matrix (bf16 model, fp32 reduce, 2 MiB bucket = 524,288
    fp32 elements, wte 8192 x 128 = 1,048,576): 4 MiB, -16.0% without it."""
    from shardbench.trainer.plan.predict import memory

    run34 = dict(n_layer=1, n_embd=128, n_head=4, vocab_size=8192, seq_len=64, micro_batch=1, bucket_mib=2)
    inp = PlanInput("zero3", 4, precision="bf16", grad_reduce_dtype="fp32", **run34)
    assert formulas.zero3_cast_copy(inp) == 4 * 8192 * 128
    # fp32 model reducing in bf16: the cast is to 2 bytes (bucket 1,048,576 bf16 elements)
    assert formulas.zero3_cast_copy(PlanInput("zero3", 4, grad_reduce_dtype="bf16", **{**run34, "vocab_size": 16384})) \
        == 2 * 16384 * 128
    # matching dtypes, every gradient within the bucket, other stages: no copy
    assert formulas.zero3_cast_copy(PlanInput("zero3", 4, precision="bf16", grad_reduce_dtype="bf16", **run34)) == 0
    assert formulas.zero3_cast_copy(PlanInput("zero3", 4, grad_reduce_dtype="fp32", **run34)) == 0
    assert formulas.zero3_cast_copy(PlanInput("zero3", 4, precision="bf16", grad_reduce_dtype="fp32",
                                              **{**run34, "bucket_mib": 25})) == 0
    assert formulas.zero3_cast_copy(PlanInput("zero2", 4, precision="bf16", grad_reduce_dtype="fp32", **run34)) == 0
    # and it is on the predicted peak: exactly the copy above the same run reducing in bf16's peak
    # less that run's bucket difference (both runs' activations are the same plain trace)
    with_copy = memory(inp)[1]
    same_dtype = memory(PlanInput("zero3", 4, precision="bf16", grad_reduce_dtype="bf16", **run34))[1]
    bucket_gap = formulas.buckets(inp) - formulas.buckets(PlanInput("zero3", 4, precision="bf16",
                                                                    grad_reduce_dtype="bf16", **run34))
    assert with_copy - same_dtype == 4 * 8192 * 128 + bucket_gap
