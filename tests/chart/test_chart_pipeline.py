"""run.pp, a first-class chart value (the trainer knob --pp marked chart=True): the chart passes
--pp, derives grad-accum from the data-parallel ranks world size / (tp x pp) (through
run.extraArgs it would count the stages of a pipeline as data-parallel ranks, and a pipeline run
would train on 1/pp of the global batch), and refuses impossible pipelines with real
`helm template`: the schema for ZeRO with pp, one template line for the product."""
from __future__ import annotations

import pytest

from chart_helpers import HELMS, launcher_argv, one, render, template_error

BAD = {
    "pp with ZeRO": (("run.pp=2", "run.strategy=zero1"), "at '/run/strategy': value must be one of 'ddp', 'fsdp'"),
    "product above the world": (("run.pp=2", "run.tp=2", "run.strategy=fsdp", "gpusPerWorker=2"),
                                "world size 2 (workers 1 x gpusPerWorker 2) is not divisible by run.pp 2 x "
                                "run.tp 2 x run.dpReplicate 1 = 4"),
    "batch over data-parallel ranks": (("run.pp=2", "workers=2", "gpusPerWorker=2", "run.microBatch=4",
                                        "run.globalBatch=4"),
                                       "run.globalBatch 4 is not a multiple of run.microBatch 4 x data-parallel "
                                       "ranks 2 (world size 4 / (run.tp 1 x run.pp 2)) = 8"),
}


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_impossible_pipelines_fail_helm_template(helm, case):
    sets, words = BAD[case]
    error = template_error(helm, sets=sets)
    assert words in error, error


@pytest.mark.parametrize("helm", sorted(HELMS))
def test_pp_reaches_the_trainer_with_grad_accum_over_data_parallel_ranks(helm):
    """ddp x pp 2 on 2 workers of 2 ranks (world 4, 2 data-parallel ranks): --pp 2 and grad-accum
    = global batch 8 / (micro-batch 2 x 2) = 2, not 8 / (2 x 4)."""
    docs = render(helm, sets=("run.strategy=ddp", "run.pp=2", "workers=2", "gpusPerWorker=2",
                              "run.microBatch=2", "run.globalBatch=8",
                              "run.extraArgs={--no-tie-embeddings,--pp-schedule,GPipe}"))
    argv = launcher_argv(one(docs, "MPIJob"))
    args = argv[argv.index("shardbench.trainer") + 1:] if "shardbench.trainer" in argv else argv
    text = " ".join(args)
    assert "--pp 2" in text and "--grad-accum 2" in text and "--no-tie-embeddings" in text, text
