"""The collector on nasty logs: it never raises, never takes a bad record, never loses a good one."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from trainer.record import END_MARKER, START_MARKER
from tui.suite import synthetic
from tui.suite.collect import collect_record, extract, failed_record, parse_progress
from tui.suite.matrix import MatrixSpec, expand

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "trainer/schema/result.schema.json").read_text())


def rec(**kw):
    return synthetic.record("zero3", 2, 1234.5, **kw)


def block(data: dict) -> str:
    return f"{START_MARKER}\n{json.dumps(data)}\n{END_MARKER}\n"


def spec():
    specs, errors = expand(MatrixSpec(strategies=["zero3"], world_sizes=[2], shape=None))
    assert not errors
    return specs[0]


def test_clean_log():
    r = rec()
    found = extract(synthetic.log_with(r))
    assert found.record == r and found.error is None and found.notes == []


def test_interleaved_ranks_between_markers_and_split_record():
    r = rec()
    text = json.dumps(r)
    # Rank 1 prints between the markers, and rank 0's JSON line itself is cut in two by rank 1's
    # output landing mid-line (large records exceed the pipe's atomic write size).
    log = (f"[rank1] warming up\n{START_MARKER}\n[rank1] step 3 loss 9.1\n{text[:200]}\n"
           f"{text[200:]}\nrank1: gloo: connection closed\n{END_MARKER}\n")
    assert extract(log).record == r


def test_launcher_prefixes_are_stripped():
    r = rec()
    log = f"[1,0]<stdout>:{START_MARKER}\n[1,0]<stdout>:{json.dumps(r)}\n[1,0]<stdout>:{END_MARKER}\n"
    assert extract(log).record == r
    pdsh = f"worker-0: {START_MARKER}\nworker-0: {json.dumps(r)}\nworker-0: {END_MARKER}\n"
    assert extract(pdsh).record == r


def test_two_records_last_wins_and_run_id_preferred():
    first, second = rec(final_loss=1.0), rec(final_loss=2.0)
    found = extract(block(first) + "retrying\n" + block(second))
    assert found.record["final_loss"] == 2.0 and "2 records" in found.notes[0]
    other = synthetic.record("ddp", 1, 10.0)
    found = extract(block(first) + block(other), run_id=first["run_id"])
    assert found.record == first


def test_truncated_record_becomes_failed_with_reason():
    text = json.dumps(rec())
    log = f"step 5\n{START_MARKER}\n{text[: len(text) // 2]}"
    run = spec()
    record, _ = collect_record(log, run)
    assert record["status"] == "failed" and "truncated" in record["error"]
    assert record["run_id"] == run.run_id and record["world_size"] == 2
    jsonschema.validate(record, SCHEMA)


def test_corrupt_json_between_markers():
    log = f"{START_MARKER}\n{{\"run_id\": \"x\", \"status\": ok}}\n{END_MARKER}\n"
    found = extract(log)
    assert found.record is None and "invalid JSON" in found.error


def test_good_record_survives_an_earlier_corrupt_one():
    r = rec()
    log = f"{START_MARKER}\n{{broken\n{END_MARKER}\n" + block(r)
    found = extract(log)
    assert found.record == r and any("invalid JSON" in n for n in found.notes)


def test_no_record_reports_last_error_line():
    log = "Traceback (most recent call last):\n  File x\nRuntimeError: Connection reset by peer\n"
    record, _ = collect_record(log, spec())
    assert record["status"] == "failed"
    assert record["error"] == "no result record in the log; last error line: RuntimeError: Connection reset by peer"
    jsonschema.validate(record, SCHEMA)


@pytest.mark.parametrize("bad", [
    {"schema_version": 99, "run_id": "a", "status": "ok", "strategy": "ddp", "world_size": 1},
    {"schema_version": 1, "run_id": "a", "status": "great", "strategy": "ddp", "world_size": 1},
    {"schema_version": 1, "run_id": "a", "status": "ok", "strategy": "ddp", "world_size": "2"},
    [1, 2, 3],
])
def test_wrong_shaped_records_are_refused(bad):
    found = extract(f"{START_MARKER}\n{json.dumps(bad)}\n{END_MARKER}\n")
    assert found.record is None and found.error


def test_binary_junk_never_raises_and_keeps_the_record():
    rng = random.Random(7)
    r = rec()
    junk = bytes(rng.randrange(256) for _ in range(20000))
    data = junk + b"\n" + block(r).encode() + junk
    assert extract(data).record == r
    for _ in range(200):  # pure junk, with markers sprinkled in: never an exception
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))
        marker = rng.choice([b"", START_MARKER.encode(), END_MARKER.encode(), b"{"])
        found = extract(noise[:100] + marker + noise[100:])
        assert found.record is None


def test_failed_record_without_spec_is_schema_valid():
    jsonschema.validate(failed_record(None, "no record", run_id="x"), SCHEMA)


def test_parse_progress():
    line = '[1,0]<stdout>:SHARDBENCH_PROGRESS {"step": 3, "steps": 10, "tokens_per_s": 5.5}'
    assert parse_progress(line) == {"step": 3, "steps": 10, "tokens_per_s": 5.5}
    assert parse_progress("SHARDBENCH_PROGRESS {bad") is None
    assert parse_progress('SHARDBENCH_PROGRESS {"step": "x"}') is None
    assert parse_progress("plain line") is None


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tui.suite.cli", *args], capture_output=True, text=True)


def test_cli_collect(tmp_path):
    r = rec()
    good = tmp_path / "good.log"
    good.write_text(synthetic.log_with(r))
    out = tmp_path / "result.json"
    proc = run_cli("collect", str(good), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text()) == r
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"\x00\xff" + START_MARKER.encode() + b"\n{\"half\": ")
    proc = run_cli("collect", str(bad), "-o", str(out), "--run-id", "zero3-w2")
    assert proc.returncode == 1 and "truncated" in proc.stderr
    written = json.loads(out.read_text())
    assert written["status"] == "failed" and written["run_id"] == "zero3-w2"
    assert run_cli("collect", str(tmp_path / "missing.log")).returncode == 2
