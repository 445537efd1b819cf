"""Read a run's result record out of its log stream, whatever state the log is in.

The trainer's rank 0 prints the record as one JSON line between BENCHMARK_RESULT_JSON_START and
BENCHMARK_RESULT_JSON_END (trainer/record.py). A real log is messier than that: other ranks'
lines land between the markers, launchers prefix lines (`[1,0]<stdout>:`, `host: `), a crash
leaves a START with no END or half a JSON line, a retried run prints two records, a dying
process writes binary junk. Rules, in order:

1. The log is decoded as UTF-8 with bad bytes replaced, so junk never raises.
2. Each START opens a block that ends at the next END, the next START or the end of the log.
   Inside a block every line (prefix stripped) that parses as a JSON object is a candidate; when
   none does (the record was split across lines by another rank's output arriving mid-line), the
   block's lines are joined and decoded from the first `{`.
3. A candidate is valid when it is an object with schema_version == SCHEMA_VERSION, a known
   status and the core fields (run_id, strategy, world_size) of the right types.
4. Several valid records: the last one wins (a retried run's latest attempt is the one that
   counts), preferring records whose run_id matches the expected id when one is given. The
   others are reported in `notes`.
5. No valid record: the result is a failed record built from the run spec, whose error says why
   (no record; START without END; invalid JSON; wrong schema) plus the log's last error line.

Nothing here raises on log content; `collect_record` always returns a record.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from trainer.record import END_MARKER, PROGRESS_PREFIX, SCHEMA_VERSION, START_MARKER, STATUSES, ResultRecord

# Launcher line prefixes: OpenMPI --tag-output / --output-tag, pdsh ("host: "), torchrun
# --tee/--role prefixes ("[default0]:").
_PREFIX = re.compile(r"^(\[\d+,\d+\]<std(?:out|err)>:\s?|\[[\w.-]*\d+\]:\s?|[\w.-]+: (?=\{|BENCHMARK_|SHARDBENCH_))")
_ERROR_LINE = re.compile(r"^\s*(\w+(\.\w+)*(Error|Exception|Interrupt)|error|ERROR|Killed|Traceback)\b")


@dataclass
class Extracted:
    """What the log held: the chosen record or why there is none."""

    record: dict[str, Any] | None = None
    error: str | None = None
    """Why no record was taken (when record is None)."""
    notes: list[str] = field(default_factory=list)
    """Things a reader should know (other records ignored, blocks that did not parse)."""


def decode(data: bytes | str) -> str:
    if isinstance(data, bytes):
        return data.decode("utf-8", errors="replace")
    return data


def strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _blocks(lines: list[str]) -> list[tuple[list[str], bool]]:
    """(lines between markers, closed by END) for every START in the log."""
    blocks, current = [], None
    for line in lines:
        if START_MARKER in line:
            if current is not None:
                blocks.append((current, False))
            current = []
            tail = line.split(START_MARKER, 1)[1].strip()
            if tail:  # record printed on the marker's own line by a sloppy writer
                current.append(tail)
        elif END_MARKER in line and current is not None:
            head = line.split(END_MARKER, 1)[0].strip()
            if head:
                current.append(head)
            blocks.append((current, True))
            current = None
        elif current is not None:
            current.append(line)
    if current is not None:
        blocks.append((current, False))
    return blocks


def _decode_object(text: str) -> Any:
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object")
    obj, _ = json.JSONDecoder().raw_decode(text[start:])
    return obj


def _candidates(block: list[str]) -> tuple[list[Any], str | None]:
    found, first_error = [], None
    for raw in block:
        line = strip_prefix(raw).strip()
        if not line.startswith("{"):
            continue
        try:
            found.append(_decode_object(line))
        except ValueError as exc:
            first_error = first_error or f"invalid JSON: {exc}"
    if found:
        return found, None
    joined = "".join(strip_prefix(raw).strip() for raw in block)
    try:
        return [_decode_object(joined)], None
    except ValueError as exc:
        return [], first_error or f"invalid JSON: {exc}"


def validate(obj: Any) -> str | None:
    """None when `obj` is a usable record; otherwise why not (one line)."""
    if not isinstance(obj, dict):
        return f"record is a {type(obj).__name__}, not an object"
    if obj.get("schema_version") != SCHEMA_VERSION:
        return f"record schema_version {obj.get('schema_version')!r}, this collector reads {SCHEMA_VERSION}"
    if obj.get("status") not in STATUSES:
        return f"record status {obj.get('status')!r} is not one of {', '.join(STATUSES)}"
    for key, kind in (("run_id", str), ("strategy", str), ("world_size", int)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            return f"record field {key} is missing or not a {kind.__name__}"
    return None


def extract(data: bytes | str, run_id: str | None = None) -> Extracted:
    """Find the record in a log (rules in the module docstring)."""
    lines = decode(data).splitlines()
    out = Extracted()
    valid: list[dict] = []
    problems: list[str] = []
    for block, closed in _blocks(lines):
        cands, err = _candidates(block)
        if err:
            problems.append(err if closed else "record truncated (START marker without END)")
        for obj in cands:
            why = validate(obj)
            (problems.append(why) if why else valid.append(obj))
    if valid:
        matching = [r for r in valid if run_id is None or r.get("run_id") == run_id]
        out.record = (matching or valid)[-1]
        if len(valid) > 1:
            out.notes.append(f"{len(valid)} records in the log; took the last"
                             + (" matching run id" if matching and len(matching) < len(valid) else ""))
        out.notes += [f"ignored: {p}" for p in problems]
        return out
    if problems:
        out.error = problems[-1]
    else:
        out.error = "no result record in the log"
    last = last_error_line(lines)
    if last:
        out.error += f"; last error line: {last}"
    return out


def last_error_line(lines: list[str]) -> str | None:
    """The log's last line that looks like an error (exception name, Killed, ERROR), trimmed."""
    for raw in reversed(lines):
        line = strip_prefix(raw).strip()
        if _ERROR_LINE.match(line) and not line.startswith("Traceback"):
            return line[:300]
    return None


def parse_progress(line: str) -> dict[str, Any] | None:
    """The payload of a `SHARDBENCH_PROGRESS {json}` line, or None for any other line."""
    idx = line.find(PROGRESS_PREFIX)
    if idx < 0:
        return None
    try:
        obj = _decode_object(line[idx + len(PROGRESS_PREFIX):])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("step"), int) else None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def failed_record(spec: Any | None, error: str, status: str = "failed", run_id: str | None = None,
                  **extra: Any) -> dict[str, Any]:
    """A schema-valid record for a run that produced none, labelled from its RunSpec (if known)."""
    rec = ResultRecord(status=status, error=error, finished_at=now_iso())
    if spec is not None:
        rec.run_id = spec.run_id
        rec.strategy, rec.launcher = spec.strategy, spec.launcher
        rec.world_size, rec.nodes, rec.devices_per_node = spec.world_size, spec.nodes, spec.procs_per_node
        rec.gpu_shape, rec.precision, rec.seq_len = spec.shape, spec.precision, spec.seq_len
        rec.model = {"preset": spec.model}
        rec.micro_batch, rec.grad_accum, rec.global_batch = spec.micro_batch, spec.grad_accum, spec.global_batch
        rec.tokens_per_step = spec.global_batch * spec.seq_len
        rec.steps, rec.warmup_steps, rec.seed = spec.steps, spec.warmup_steps, spec.seed
        rec.usd_per_gpu_hour = spec.usd_per_gpu_hour
        rec.args = spec.trainer_args()
    if run_id:
        rec.run_id = run_id
    data = rec.to_dict()
    data.update(extra)
    return data


def collect_record(data: bytes | str, spec: Any | None = None, run_id: str | None = None) -> tuple[dict, list[str]]:
    """The run's record from its log: the valid one, or a failed one saying why. Plus notes."""
    rid = spec.run_id if spec is not None else run_id
    found = extract(data, rid)
    if found.record is not None:
        return found.record, found.notes
    return failed_record(spec, found.error or "no result record in the log", run_id=rid), found.notes
