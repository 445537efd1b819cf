"""Checkpoints that fail verification, on real runs (issue 19): the newest one corrupt, lying or
incomplete makes the run fall back to the one before it and then save over the rejected one
(it crashed with `Directory not empty`); all of them corrupt makes the run start afresh and keep
its new checkpoints (rotation deleted those and kept the corrupt ones); a malformed manifest is
a rejected checkpoint, never an AttributeError."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.reference_runs import SHARED, shared_run
from tests.trainer.conftest import run_trainer
from shardbench.trainer import checkpoint

ARGS = ["--strategy", "ddp", "--micro-batch", "4", "--model", "tiny", "--seq-len", "32", "--global-batch", "4",
        "--steps", "8", "--warmup-steps", "1", "--precision", "fp32", "--seed", "11", "--lr", "1e-3",
        "--progress-every", "100", "--checkpoint-every", "3"]


def train(tmp: Path, ckpt: Path, *extra: str) -> dict:
    run = run_trainer([*ARGS, "--checkpoint-dir", str(ckpt), *extra], tmp)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record


@pytest.fixture(scope="module")
def full():
    """An uninterrupted run: its record and its checkpoints at steps 3 and 6, run once per session
    (test_checkpoint_guard uses it too): tests change a copy, never these."""
    run = shared_run([*ARGS, "--checkpoint-dir", f"{SHARED}/ckpt"])
    assert run.returncode == 0, run.stderr[-3000:]
    return run.record, run.dir / "ckpt"


def names(ckpt: Path) -> list[str]:
    return [p.name for _, p in checkpoint.committed(ckpt)]


def flip_a_bit(step_dir: Path) -> None:
    f = step_dir / "dcp" / "__0_0.distcp"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))


def drop_with_entry(step_dir: Path, rel: str) -> None:
    (step_dir / rel).unlink()
    manifest = json.loads((step_dir / checkpoint.MANIFEST).read_text())
    del manifest["files"][rel]
    (step_dir / checkpoint.MANIFEST).write_text(json.dumps(manifest))


DAMAGE = {
    "flipped-bit": flip_a_bit,
    "manifest-not-json": lambda d: (d / checkpoint.MANIFEST).write_text("{\"files\": {"),
    "manifest-files-a-list": lambda d: (d / checkpoint.MANIFEST).write_text('{"files": []}'),
    "manifest-entry-not-an-object": lambda d: (d / checkpoint.MANIFEST).write_text('{"files": {"trainer_state.json": 5}}'),
    "shard-removed-with-its-entry": lambda d: drop_with_entry(d, "dcp/__0_0.distcp"),
    "rng-removed-with-its-entry": lambda d: drop_with_entry(d, "rng-rank0.pt"),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_verify_rejects_with_a_reason(full, tmp_path, damage):
    copy = tmp_path / "step"
    shutil.copytree(full[1] / checkpoint.step_dir_name(6), copy)
    assert checkpoint.verify(copy) is None
    DAMAGE[damage](copy)
    assert isinstance(checkpoint.verify(copy), str)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["manifest-files-a-list", "shard-removed-with-its-entry"])
def test_a_rejected_newest_checkpoint_is_replaced_by_the_next_save(full, tmp_path, damage):
    record, ckpt = full
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    DAMAGE[damage](copy / checkpoint.step_dir_name(6))
    resumed = train(tmp_path, copy)  # --resume auto: step 6 is rejected, step 3 loads, step 6 is saved again
    assert resumed["checkpoint"]["resumed_from_step"] == 3
    assert names(copy) == ["step-00000006", "step-00000003"]
    assert all(checkpoint.verify(p) is None for _, p in checkpoint.committed(copy))
    assert resumed["loss_per_step"] == pytest.approx(record["loss_per_step"], rel=1e-6)


@pytest.mark.slow
def test_all_checkpoints_rejected_the_new_ones_are_kept(full, tmp_path):
    record, ckpt = full
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    for _, path in checkpoint.committed(copy):
        flip_a_bit(path)
    # An older run's corrupt checkpoint past this run's end must not outlive the new ones either.
    shutil.copytree(copy / checkpoint.step_dir_name(6), copy / checkpoint.step_dir_name(9))
    again = train(tmp_path, copy)
    assert again["checkpoint"]["resumed_from_step"] is None
    assert names(copy) == ["step-00000006", "step-00000003"]
    assert all(checkpoint.verify(p) is None for _, p in checkpoint.committed(copy))
    assert again["loss_per_step"] == pytest.approx(record["loss_per_step"], rel=1e-6)


def test_rotation_keeps_the_newest_valid_checkpoint(tmp_path):
    for step in (1, 3, 6, 9):
        (tmp_path / checkpoint.step_dir_name(step)).mkdir()
    checkpoint.rotate(tmp_path, 2, head=3, rejected=["step-00000006", "step-00000009"])
    assert names(tmp_path) == ["step-00000003", "step-00000001"]


def test_commit_replaces_a_rejected_directory_at_the_same_step(tmp_path):
    final = tmp_path / checkpoint.step_dir_name(6)
    (final / "dcp").mkdir(parents=True)
    (final / "dcp" / "old.bin").write_bytes(b"old")
    tmp = tmp_path / (checkpoint.TMP_PREFIX + final.name)
    tmp.mkdir()
    (tmp / "new.bin").write_bytes(b"new")
    manifest = checkpoint.commit(tmp, final)
    assert sorted(manifest["files"]) == ["new.bin"] and not (final / "dcp").exists()
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


@pytest.mark.slow
def test_the_record_names_the_checkpoint_it_resumed_from(full, tmp_path, result_schema):
    """Issue 35: the record says which checkpoint directory a run resumed and whether it lies under
    the run's own results dir (--output-dir); a fresh run says neither."""
    import jsonschema

    record, ckpt = full
    assert record["checkpoint"]["resumed_from"] is None and record["checkpoint"]["resumed_from_output_dir"] is None
    results = tmp_path / "results"
    shutil.copytree(ckpt, results / "ckpt")
    resumed = train(tmp_path, results / "ckpt", "--output-dir", str(results))
    step6 = (results / "ckpt" / checkpoint.step_dir_name(6)).resolve()
    assert resumed["checkpoint"]["resumed_from_step"] == 6
    assert resumed["checkpoint"]["resumed_from"] == str(step6)
    assert resumed["checkpoint"]["resumed_from_output_dir"] is True
    assert json.loads((results / "result.json").read_text())["checkpoint"]["resumed_from"] == str(step6)
    jsonschema.validate(resumed, result_schema)
    # The same checkpoint resumed by name from a run whose results dir is elsewhere says so.
    elsewhere = train(tmp_path, tmp_path / "none", "--resume", str(step6), "--output-dir", str(tmp_path / "other"),
                      "--resume-allow", "checkpointing")
    assert elsewhere["checkpoint"]["resumed_from"] == str(step6)
    assert elsewhere["checkpoint"]["resumed_from_output_dir"] is False
