"""Values that cannot work fail `helm template` with a message that names the problem (the schema's
own message, or one line from the chart's cross-field checks), with helm 3 and helm 4."""
from __future__ import annotations

import pytest

from chart_helpers import HELMS, template_error

CASES = {
    # name: (values files, --set, text the error must contain)
    "unknown strategy": ((), ("run.strategy=zero4",),
                         "at '/run/strategy': value must be one of 'ddp', 'fsdp', 'zero1', 'zero2', 'zero3'"),
    "unknown launcher": ((), ("launcher=torchrun",), "at '/launcher': value must be one of 'mpirun', 'deepspeed'"),
    "unknown precision": ((), ("run.precision=fp8",), "at '/run/precision': value must be one of"),
    "workers 0": ((), ("workers=0",), "at '/workers': minimum: got 0, want 1"),
    "typo'd key": ((), ("run.microbatch=2",), "at '/run': additional properties 'microbatch' not allowed"),
    "typo'd top-level key": (("h100.yaml",), ("worker=2",), "additional properties 'worker' not allowed"),
    "gpusPerWorker -1": ((), ("gpusPerWorker=-1",), "at '/gpusPerWorker': minimum: got -1, want 1"),
    "micro-batch 0": ((), ("run.microBatch=0",), "at '/run/microBatch': minimum: got 0, want 1"),
    "non-NCCL key under nccl": ((), ("nccl.SOCKET_IFNAME=eth0",), "does not match pattern '^NCCL_"),
    "batch that does not divide": (
        ("h100.yaml",), ("workers=2", "run.microBatch=4", "run.globalBatch=100"),
        "run.globalBatch 100 is not a multiple of run.microBatch 4 x world size 16 "
        "(workers 2 x gpusPerWorker 8) = 64"),
    "global batch below one step": (
        (), ("run.globalBatch=4",), "run.globalBatch 4 is not a multiple of run.microBatch 4 x world size 2"),
    "warm-up eats every step": ((), ("run.steps=5", "run.warmupSteps=5"),
                                "run.warmupSteps 5 must be below run.steps 5"),
    "more GPUs than the node has": (("a10.yaml",), ("gpusPerWorker=4",),
                                    "gpusPerWorker 4 is more than shape a10 has per node (2)"),
    "cuda without GPUs": (("cpu.yaml",), ("run.device=cuda",), "run.device cuda needs GPUs"),
    "checkpoints without a volume": ((), ("checkpoint.enabled=true",), "checkpoint.enabled needs persistence.enabled"),
    "seq len above the preset's block size": (
        (), ("run.model=tiny", "run.seqLen=512"), "run.seqLen 512 is above model tiny's block size 256"),
    "gpuResource that is no resource name": ((), ("gpuResource=gpu",), "at '/gpuResource': 'gpu' does not match pattern"),
}


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_values_fail_with_a_clear_message(helm, case):
    values, sets, expect = CASES[case]
    err = template_error(helm, values, sets)
    assert expect in err, err
    # The reason is on one line, not spread over a template trace.
    assert any(expect in line for line in err.splitlines()), err
