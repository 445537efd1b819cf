"""run.offload and run.zeroHpzPartitionSize, first-class chart values (the trainer knobs --offload
and --zero-hpz-partition-size marked chart=True): the chart passes them, and the schema refuses
what trainer/rules.py refuses on run: alone (generated from rules.state_error over the strategy
table: offload with ddp, parameters offloaded below ZeRO-3, fsdp's optimizer alone; hpZ below
ZeRO-3 or with parameters offloaded; offload with tp or pp) and the template the products (hpZ not
dividing the data-parallel ranks, fsdp offload on one rank), with real `helm template`."""
from __future__ import annotations

import pytest

from chart_helpers import HELMS, launcher_argv, one, render, template_error

BAD = {
    "offload with ddp": (("run.strategy=ddp", "run.offload=optimizer"), "at '/run/strategy'"),
    "params offloaded at zero2": (("run.strategy=zero2", "run.offload=params"), "at '/run/strategy'"),
    "fsdp optimizer alone": (("run.strategy=fsdp", "run.offload=optimizer"), "at '/run/strategy'"),
    "hpz at zero2": (("run.strategy=zero2", "run.zeroHpzPartitionSize=2"), "at '/run/strategy'"),
    "hpz with params offloaded": (("run.strategy=zero3", "run.zeroHpzPartitionSize=2", "run.offload=params"),
                                  "at '/run/offload'"),
    "fsdp offload with tp": (("run.strategy=fsdp", "run.offload=params", "run.tp=2", "gpusPerWorker=4"),
                             "at '/run/tp'"),
    "fsdp offload with pp": (("run.strategy=fsdp", "run.offload=params", "run.pp=2", "gpusPerWorker=4"),
                             "at '/run/pp'"),
    "hpz not dividing the ranks": (("run.strategy=zero3", "run.zeroHpzPartitionSize=3", "workers=2", "gpusPerWorker=2"),
                                   "run.zeroHpzPartitionSize 3 does not divide the 4 data-parallel ranks"),
    "fsdp offload on one rank": (("run.strategy=fsdp", "run.offload=params", "gpusPerWorker=1"),
                                 "run.offload params with fsdp needs more than one data-parallel rank"),
    "not a placement": (("run.strategy=zero3", "run.offload=disk"), "at '/run/offload'"),
}


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("case", sorted(BAD))
def test_impossible_placements_fail_helm_template(helm, case):
    sets, words = BAD[case]
    error = template_error(helm, sets=sets)
    assert words in error, error


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("sets,flags", [
    (("run.strategy=zero2", "run.offload=optimizer"), "--offload optimizer --zero-hpz-partition-size 1"),
    (("run.strategy=fsdp", "run.offload=params"), "--offload params --zero-hpz-partition-size 1"),
    (("run.strategy=zero3", "run.zeroHpzPartitionSize=2", "workers=2", "gpusPerWorker=2"),
     "--offload none --zero-hpz-partition-size 2"),
])
def test_offload_and_hpz_reach_the_trainer(helm, sets, flags):
    argv = launcher_argv(one(render(helm, sets=sets), "MPIJob"))
    assert flags in " ".join(argv), argv
