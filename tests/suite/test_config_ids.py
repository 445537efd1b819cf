"""Config ids hash only the measured settings off their defaults, plus a hash version
(trainer.config.id_fields, trainer.contract.config_id): adding a knob keeps every existing id,
resume keeps a run whose saved spec.json predates a knob, a results directory keyed by an older
id version is refused with one line, and `compare` of sets with nothing in common exits 2."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import make_dataclass, replace
from pathlib import Path

import pytest

from shardbench.trainer import contract
from shardbench.trainer.config import RunConfig, id_fields, knob
from shardbench.trainer.record import write_atomic
from tests import synthetic
from shardbench.suite.backends.local import LocalBackend
from shardbench.suite.matrix.expand import MatrixSpec, expand
from shardbench.suite.execute.runner import Runner
from shardbench.suite.execute.store import ResultsDir, ResultsDirError

ROOT = Path(__file__).resolve().parents[2]

# RunConfig with one more knob, as a contributor would add it (the knob-flow fixture's field).
WithKnob = make_dataclass("WithKnob", [("throwaway_depth", int, knob(3, section="model", min=1))], bases=(RunConfig,))

CONFIGS = [RunConfig(strategy="ddp"), RunConfig(strategy="zero3", micro_batch=2, lr=3e-4, bucket_mib=50),
           RunConfig(strategy="fsdp", precision="bf16", seq_len=64, grad_accum=4, reshard_after_forward=False)]


def cid(cfg, world=2, nodes=1, launcher="mpirun") -> str:
    return contract.config_id(id_fields(cfg, world, nodes, launcher))


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.strategy)
def test_a_new_knob_at_its_default_keeps_every_existing_id(cfg):
    grown = WithKnob(**{k: v for k, v in vars(cfg).items()})
    assert cid(grown) == cid(cfg)
    assert cid(replace(grown, throwaway_depth=4)) != cid(cfg)  # set off its default, it is measured


def test_ids_hash_only_settings_off_their_defaults_and_the_version():
    cfg = RunConfig(strategy="ddp", lr=2e-4)
    hashed = id_fields(cfg, 2, 1, "mpirun")
    assert hashed["lr"] == 2e-4 and "weight_decay" not in hashed and "global_batch" not in hashed
    assert {"strategy", "seq_len", "grad_accum", "world_size", "nodes", "launcher"} <= set(hashed)
    # an explicit default and the default given implicitly are one configuration
    assert cid(RunConfig(strategy="ddp", bucket_mib=25)) == cid(RunConfig(strategy="ddp"))
    plain = json.dumps(id_fields(RunConfig(strategy="ddp"), 2, 1, "mpirun"), sort_keys=True, separators=(",", ":"))
    assert cid(RunConfig(strategy="ddp")) != hashlib.sha256(plain.encode()).hexdigest()[:8]  # version hashed


def only_spec(tmp_path: Path):
    specs, errors = expand(MatrixSpec(strategies=["ddp"], world_sizes=[1], seq_lens=[64], repeats=1, steps=3,
                                      warmup_steps=1, results=str(tmp_path / "results")))
    assert not errors
    return specs[0]


def finished(results: Path, spec, saved: dict) -> None:
    rec = synthetic.record(spec.strategy, spec.world_size, 1000.0, seq_len=spec.seq_len,
                           micro_batch=spec.micro_batch, grad_accum=spec.grad_accum, repeat=spec.repeat)
    rec.update(run_id=spec.run_id, config_id=spec.config_id, steps=spec.steps, warmup_steps=spec.warmup_steps,
               seed=spec.seed)
    write_atomic(saved, str(results / spec.run_id / "spec.json"))
    write_atomic(rec, str(results / spec.run_id / "result.json"))


def test_resume_keeps_a_run_whose_spec_json_predates_a_knob_at_its_default(tmp_path):
    spec = only_spec(tmp_path)
    saved = json.loads(json.dumps(spec.to_dict()))
    del saved["bucket_mib"]  # written before --bucket-mib existed; this run has it at its default
    finished(tmp_path / "results", spec, saved)
    record, why = ResultsDir(tmp_path / "results").trusted(spec)
    assert record is not None, why
    saved["lr"] = 1.0  # a knob that really differs still makes it another run
    finished(tmp_path / "results", spec, saved)
    assert ResultsDir(tmp_path / "results").trusted(spec) == (None, "spec.json differs from this run's spec")


def test_a_results_dir_keyed_by_an_older_id_version_is_refused_in_one_line(tmp_path):
    spec = only_spec(tmp_path)
    old = json.loads(json.dumps(spec.to_dict()))
    del old["config_id_version"]  # what every spec.json before version 2 looks like
    results = tmp_path / "results"
    finished(results, replace(spec, run_id="ddp-w1-s64-mb4-ga1-0123abcd-r0"), old)
    runner = Runner([spec], LocalBackend(search_path=str(tmp_path / "no-bin")), results)
    with pytest.raises(ResultsDirError, match="1 run.s. keyed by an older config id version"):
        runner.open()
    ResultsDir(results).open().close()  # the refusal left the lock free
    # the CLI says it in one line and exits 2, before anything runs
    out = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--strategies", "ddp",
                          "--world-sizes", "1", "--seq-lens", "64", "--steps", "3", "--warmup-steps", "1",
                          "--no-plan", "--quiet", "--results", str(results)],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "older config id version" in out.stderr
    assert sorted(p.name for p in results.iterdir() if p.is_dir()) == ["ddp-w1-s64-mb4-ga1-0123abcd-r0"]


def test_compare_of_sets_with_no_configuration_in_common_exits_2_in_one_line(tmp_path):
    for side, strategy in (("a", "ddp"), ("b", "zero3")):
        rec = synthetic.record(strategy, 2, 1000.0)
        write_atomic(rec, str(tmp_path / side / rec["run_id"] / "result.json"))
    out = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "compare", str(tmp_path / "a"),
                          str(tmp_path / "b")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "no configuration is in both" in out.stderr
