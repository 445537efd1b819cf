"""run.tp and run.dpReplicate, first-class chart values (trainer knobs marked chart=True, through
the generated contract and schema): the chart passes them as --tp / --dp-replicate, derives
grad-accum from the data-parallel ranks (world size / tp), and refuses impossible layouts with
real `helm template`: the schema where JSON Schema can say it alone (tp with ZeRO, dpReplicate
without fsdp), one template line for the products (tp must divide gpusPerWorker, so a TP group
stays inside one worker; tp x dpReplicate must divide the world size)."""
from __future__ import annotations

import pytest

from chart_helpers import HELMS, launcher_argv, one, render, template_error

BAD = {
    "tp with ZeRO": (("run.tp=2", "run.strategy=zero2"), "at '/run/strategy': value must be one of 'ddp', 'fsdp'"),
    "dpReplicate without fsdp": (("run.dpReplicate=2",), "at '/run/strategy': value must be 'fsdp'"),
    "tp 0": (("run.tp=0",), "at '/run/tp': minimum: got 0, want 1"),
    "tp across workers": (("run.tp=3", "gpusPerWorker=4"),
                          "run.tp 3 does not divide gpusPerWorker 4: a tensor-parallel group must stay inside one "
                          "worker"),
    "product above the world": (("run.tp=2", "run.dpReplicate=2", "run.strategy=fsdp", "gpusPerWorker=2"),
                                "world size 2 (workers 1 x gpusPerWorker 2) is not divisible by run.tp 2 x "
                                "run.dpReplicate 2 = 4"),
    "batch over data-parallel ranks": (("run.tp=2", "workers=2", "run.microBatch=4", "run.globalBatch=4"),
                                       "run.globalBatch 4 is not a multiple of run.microBatch 4 x data-parallel "
                                       "ranks 2 (world size 4 / run.tp 2) = 8"),
}


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_impossible_layouts_fail_helm_template(helm, case):
    sets, words = BAD[case]
    error = template_error(helm, sets=sets)
    assert words in error, error
    assert len([line for line in error.splitlines() if "run.tp" in line or "at '/run" in line]) >= 1


@pytest.mark.parametrize("helm", sorted(HELMS))
def test_tp_and_dp_replicate_reach_the_trainer(helm):
    """fsdp+tp 2x2 on 2 workers of 2 ranks (world 4, one TP group per worker): the flags, and
    grad-accum = global batch / (micro-batch x 2 data-parallel ranks)."""
    docs = render(helm, sets=("run.strategy=fsdp", "run.tp=2", "workers=2", "gpusPerWorker=2",
                              "run.microBatch=2", "run.globalBatch=8"))
    argv = launcher_argv(one(docs, "MPIJob"))
    args = argv[argv.index("shardbench.trainer") + 1:] if "shardbench.trainer" in argv else argv
    text = " ".join(args)
    assert "--tp 2 --dp-replicate 1" in text and "--grad-accum 2" in text, text
