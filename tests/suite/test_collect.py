"""The collector on nasty logs: it never raises, never takes a bad record, never loses a good one."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from shardbench.trainer.record import END_MARKER, START_MARKER
from tests import synthetic
from shardbench.suite.execute.collect import extract, extract_file, failed_record, parse_progress
from shardbench.suite.matrix.expand import MatrixSpec, expand

REPO = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "trainer/schema/result.schema.json").read_text())


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
    record = failed_record(run, extract(log, run.run_id).error)
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
    record = failed_record(spec(), extract(log).error)
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
    return subprocess.run([sys.executable, "-m", "shardbench.suite.cli", *args], capture_output=True, text=True)


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


def test_deeply_nested_json_is_an_error_not_an_exception(tmp_path):
    deep = "{\"a\": " * 10_000 + "1" + "}" * 10_000
    found = extract(f"{START_MARKER}\n{deep}\n{END_MARKER}\n")
    assert found.record is None and "nested too deep" in found.error
    path = tmp_path / "result.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    found = extract_file(path)
    assert found.record is None and found.error == "no result record in the log"


def test_record_cut_mid_line_by_another_ranks_output():
    """Rank 1's line lands inside rank 0's record line (a write larger than the pipe's atomic
    size): the record's first piece ends in rank 1's text, its rest is on a later line."""
    r = rec(error=None)
    text = json.dumps(r)
    mid_number = text.index('"tokens_per_s": ') + len('"tokens_per_s": ') + 2
    after_comma = text.index(', "loss_per_step"') + 2
    for cut in (17, mid_number, after_comma, len(text) - 3):
        log = (f"{START_MARKER}\n{text[:cut]}[rank1] step 3 loss 9.1\n"
               f"[rank1] another line\n{text[cut:]}\n{END_MARKER}\n")
        assert extract(log).record == r, cut
    # Inside a JSON string the foreign text cannot be told apart from the string: it stays in
    # that string, and the record (its numbers) is still recovered.
    cut = text.index('"Test CPU"') + 5
    found = extract(f"{START_MARKER}\n{text[:cut]}[rank1] x\n{text[cut:]}\n{END_MARKER}\n").record
    assert found["tokens_per_s"] == r["tokens_per_s"] and found["device_name"] == "Test[rank1] xCPU"


def test_json_line_from_another_rank_does_not_hide_the_record():
    r = rec()
    text = json.dumps(r)
    log = f'{START_MARKER}\n{{"rank": 1, "event": "done"}}\n{text[:300]}\n{text[300:]}\n{END_MARKER}\n'
    assert extract(log).record == r


def test_end_marker_inside_the_error_message_keeps_the_record():
    r = rec(status="failed", error=f"RuntimeError: child printed {END_MARKER} and {START_MARKER}\nthen died")
    found = extract(block(r) + "noise\n")
    assert found.record == r, found.error


def test_collector_streams_a_large_log_in_bounded_memory(tmp_path):
    """40 MB of noise then the record: peak memory grows by far less than the log's size (the
    old reader held about nine copies of it)."""
    log = tmp_path / "big.log"
    line = ("[rank1] " + "noise " * 160 + "\n").encode()
    with open(log, "wb") as fh:
        for _ in range(40_000_000 // len(line)):
            fh.write(line)
        fh.write(block(rec()).encode())
    code = (f"import resource; from shardbench.suite.execute.collect import extract_file; "
            f"before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"found = extract_file({str(log)!r}); assert found.record is not None, found.error; "
            f"print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) < 10_000, f"grew {int(proc.stdout)} KiB reading a 40 MB log"


def test_cli_collect_on_a_file_without_record_prints_one_line():
    proc = run_cli("collect", "/etc/hostname")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "no valid record in /etc/hostname" in proc.stderr


def test_a_record_of_several_megabytes_is_read_whole_from_a_file(tmp_path):
    """100,000 steps make a record line of megabytes: streaming must not cut it (a cut at a space
    inside a string would change the string)."""
    r = rec(loss_per_step=[9.123456] * 300_000, device_name="Test CPU " * 1000)
    log = tmp_path / "big.log"
    log.write_text(synthetic.log_with(r))
    assert extract_file(log).record == r
