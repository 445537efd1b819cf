"""Kept predictions (suite/matrix/plan_cache.py): a matrix planned once is planned again without
the planner's process, with the same numbers; an edit to the trainer's sources, a failed plan or
the cache turned off never serves a kept answer."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from shardbench.suite.matrix import plan_cache, planning
from shardbench.suite.matrix.expand import expand, matrix_from_dict

MATRIX = {"strategies": ["ddp", "zero3"], "world_sizes": [2], "seq_lens": [32], "steps": 4, "warmup_steps": 1,
          "repeats": 1, "precision": "fp32", "device": "cpu", "shape": "cpu"}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(plan_cache.CACHE_ENV, str(tmp_path / "cache"))
    yield tmp_path / "cache" / "plans"


def specs():
    out, errors = expand(matrix_from_dict(MATRIX))
    assert not errors
    return out


def no_planner(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(f"the planner's process started: {args[0]}")
    monkeypatch.setattr(subprocess, "run", refuse)


def test_a_planned_matrix_is_planned_again_without_the_planners_process(cache, monkeypatch):
    first, why = planning.predict_specs(specs())
    assert why is None and all(planning.planned(p) for p in first.values()) and len(first) == 2
    assert len(list(cache.glob("*.json"))) == 2
    no_planner(monkeypatch)
    again, why = planning.predict_specs(specs())
    assert why is None and again == first


def test_an_edit_to_the_trainers_sources_is_a_new_plan(cache, tmp_path, monkeypatch):
    planning.predict_specs(specs())
    trainer = shutil.copytree(plan_cache.TRAINER, tmp_path / "trainer")
    monkeypatch.setattr(plan_cache, "TRAINER", trainer)
    same = plan_cache.code_fingerprint()
    with open(trainer / "plan" / "formulas.py", "a") as f:
        f.write("\n# an edit\n")
    # the same process, as a long-lived benchtui: the edit is seen (before, the first fingerprint
    # was kept for the process's life and the old plans were served)
    assert plan_cache.code_fingerprint() != same
    no_planner(monkeypatch)  # nothing kept matches the edited code: the planner must run
    predictions, why = planning.predict_specs(specs())
    assert predictions == {} and why.startswith("no plan: the planner failed (OSError")


def test_a_failed_plan_is_not_kept_and_off_keeps_nothing(cache, monkeypatch):
    plan_cache.keep("job", {"error": "RuntimeError: out of file descriptors"})
    assert plan_cache.load("job") is None
    plan_cache.keep("job", {"peak_bytes": 1})
    assert plan_cache.load("job") == {"peak_bytes": 1}
    monkeypatch.setenv(plan_cache.CACHE_ENV, "off")
    assert plan_cache.cache_dir() is None and plan_cache.load("job") is None
    plan_cache.keep("other", {"peak_bytes": 2})
    assert len(list(cache.glob("*.json"))) == 1


def test_unread_and_least_recently_used_plans_are_pruned(cache):
    """The cache never grows without bound: a plan unread for MAX_AGE_DAYS goes, and beyond
    MAX_FILES the least recently read go; reading a plan touches it, so it stays (before, nothing
    was ever removed)."""
    import os
    import time

    plan_cache.keep("job a", {"peak": 1})
    plan_cache.keep("job b", {"peak": 2})
    a, b = plan_cache._path("job a"), plan_cache._path("job b")
    stale = cache / "stale.json"
    stale.write_text("{}")
    month_ago = time.time() - (plan_cache.MAX_AGE_DAYS + 1) * 86400
    for plan in (stale, a, b):
        os.utime(plan, (month_ago, month_ago))
    assert plan_cache.load("job a") == {"peak": 1} and plan_cache.load("job b") == {"peak": 2}  # read: touched
    assert plan_cache.prune(cache) == 1 and not stale.exists()
    os.utime(a, (time.time() - 60,) * 2)  # read a minute before the other
    assert plan_cache.prune(cache, max_files=1) == 1 and [p.name for p in cache.glob("*.json")] == [b.name]
