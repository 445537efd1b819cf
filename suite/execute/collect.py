"""Read a run's result record out of its log stream, whatever state the log is in.

The trainer's rank 0 prints the record as one JSON line between BENCHMARK_RESULT_JSON_START and
BENCHMARK_RESULT_JSON_END (trainer/record.py). A real log is messier than that: other ranks'
lines land between the markers or in the middle of the record's line, launchers prefix lines
(`[1,0]<stdout>:`, `host: `), a crash leaves a START with no END or half a JSON line, a retried
run prints two records, a dying process writes binary junk. Rules, in order:

1. The log is read line by line (a `Collector` is fed lines; memory is bounded by the largest
   record, not by the log), decoded as UTF-8 with bad bytes replaced, so junk never raises.
2. A marker counts only at the start or the end of a line (after a launcher prefix): a marker
   quoted inside the record (an error message) is followed by more JSON on its line, so it is data. Each START opens
   a block that ends at the next END, the
   next START or the end of the log; a block larger than MAX_RECORD_BYTES is dropped.
3. Inside a block every line that parses as a JSON object is a candidate. When none is a valid
   record, the lines from the first `{` are joined (the record was split across lines by another
   rank's output); if that does not parse, the other rank's text glued to the end of a piece is
   cut off (tried back from where the parser failed) and whole foreign lines are skipped.
4. A candidate is valid when it is an object with a schema_version this reader knows, a known
   status and the core fields (run_id, strategy, world_size) of the right types. Nesting too deep
   for the parser is an invalid candidate, never an exception.
5. Several valid records: the last one wins (a retried run's latest attempt is the one that
   counts), preferring records whose run_id matches the expected id when one is given.
6. No valid record: `error` says why (no record; START without END; invalid JSON; wrong schema)
   plus the log's last error line.

Nothing here raises on log content.
"""
from __future__ import annotations

import io
import json
from collections import deque
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, BinaryIO

from shardbench.trainer import knobs
from shardbench.trainer.record import END_MARKER, PROGRESS_PREFIX, SCHEMA_VERSION, START_MARKER, STATUSES, ResultRecord

READABLE_SCHEMA_VERSIONS = tuple(range(1, SCHEMA_VERSION + 1))
"""Record versions this reader understands (every version up to the trainer's)."""
MAX_RECORD_BYTES = 32 << 20
"""A block between markers larger than this is not a record (a START followed by endless noise)."""
MAX_LINE_BYTES = MAX_RECORD_BYTES
"""Lines are read in pieces of at most this size (a record's line is never cut; longer noise is)."""
_CUT_TRIES = 64
"""How far back from a parse error to look for where another rank's text was glued in."""
_MAX_PIECES = 200
"""Lines of one block considered for a split record."""
_SEARCH_STEPS = 1000
"""Parse attempts at most when rejoining the record of one block."""
_SEARCH_BYTES = 256 << 20
"""Bytes parsed at most when rejoining the record of one block (about a second at worst)."""

# Launcher line prefixes: OpenMPI --tag-output / --output-tag, pdsh ("host: "), torchrun
# --tee/--role prefixes ("[default0]:").
_PREFIX = re.compile(r"^(\[\d+,\d+\]<std(?:out|err)>:\s?|\[[\w.-]*\d+\]:\s?|[\w.-]+: (?=\{|BENCHMARK_|SHARDBENCH_))")
_MARKER_STEM = "BENCHMARK_RESULT_JSON_"
_ERROR_WORDS = ("rror", "xception", "Interrupt", "ERROR", "Killed")
"""Cheap test before the error-line pattern (every word _ERROR_LINE can match contains one)."""
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


def _decode_object(text: str) -> Any:
    """The JSON value starting at the first `{` of text; ValueError for anything unparsable,
    nesting too deep included."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object")
    try:
        obj, _ = json.JSONDecoder().raw_decode(text[start:])
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    return obj


def _error_pos(text: str) -> int | None:
    """Where parsing text (from its first `{`) fails, in text's coordinates; None if it parses."""
    start = text.find("{")
    try:
        json.JSONDecoder().raw_decode(text[start:])
    except json.JSONDecodeError as exc:
        # An unterminated string is reported where it starts: the input ran out inside it.
        return len(text) if exc.msg.startswith("Unterminated string") else start + exc.pos
    except (ValueError, RecursionError):
        return len(text)
    return None


def _valid_prefix(text: str) -> bool:
    """True when text could be the beginning of a JSON object (the parser ran out of input)."""
    pos = _error_pos(text)
    return pos is None or pos >= len(text) - 1


def _rejoin(pieces: list[str], budget: list[int]) -> Any:
    """The record split over `pieces` by other ranks' output, or None. A depth-first search over
    three moves per piece: append it, skip it (a foreign line), or, when the text so far ends in
    foreign text glued to a piece, cut that text off (tried back from where the parser failed).
    The first complete parse that is a valid record wins; the search is bounded (_SEARCH_STEPS,
    _SEARCH_BYTES).
    Foreign text that landed inside a JSON string cannot be told from the string: it stays in."""
    def spend(text: str) -> bool:
        budget[0] -= 1
        budget[1] -= len(text)
        return budget[0] >= 0 and budget[1] >= 0

    def search(text: str, i: int) -> Any:
        if not spend(text):
            return None
        pos = _error_pos(text)
        if pos is None:
            obj = _decode_object(text)
            return obj if validate(obj) is None else None
        if pos >= len(text) - 1:  # ran out of input: the record goes on in a later piece
            if i == len(pieces):
                return None
            return search(text + pieces[i], i + 1) or search(text, i + 1)
        for k in range(pos, max(text.find("{"), pos - _CUT_TRIES), -1):
            head = text[:k]
            if not spend(head):
                return None
            if _valid_prefix(head):
                found = search(head, i)
                if found is not None:
                    return found
        return None

    try:
        return search(pieces[0], 1)
    except (ValueError, RecursionError):
        return None


def validate(obj: Any) -> str | None:
    """None when `obj` is a usable record; otherwise why not (one line)."""
    if not isinstance(obj, dict):
        return f"record is a {type(obj).__name__}, not an object"
    if obj.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        return (f"record schema_version {obj.get('schema_version')!r}, this reader knows "
                f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    if obj.get("status") not in STATUSES:
        return f"record status {obj.get('status')!r} is not one of {', '.join(STATUSES)}"
    for key, kind in (("run_id", str), ("strategy", str), ("world_size", int)):
        if not isinstance(obj.get(key), kind) or isinstance(obj.get(key), bool):
            return f"record field {key} is missing or not a {kind.__name__}"
    return None


def _is_marker(line: str, marker: str) -> bool:
    """A marker starts its line or ends it (junk a dying process wrote may precede it); one in
    the middle of a line is quoted data, e.g. inside the record's error message."""
    return line.startswith(marker) or line.endswith(marker)


class Collector:
    """Fed a log one line at a time; `result()` is the record (rules in the module docstring)."""

    def __init__(self, run_id: str | None = None):
        self.run_id = run_id
        self._block: list[str] | None = None
        self._block_bytes = 0
        self._last: dict | None = None
        self._last_matching: dict | None = None
        self._valid = 0
        self._problems: deque[str] = deque(maxlen=20)
        """Why blocks were not records (the latest few: a log of junk must not grow this)."""
        self._last_error: str | None = None
        self.record_seen_at: float | None = None
        """time.monotonic() when the first valid record's END marker was read."""

    def feed(self, raw: bytes | str) -> None:
        line = decode(raw).rstrip("\r\n")
        if self._block is None and _MARKER_STEM not in line:  # the common case: a plain log line
            if any(word in line for word in _ERROR_WORDS):
                self._note_error(strip_prefix(line).strip())
            return
        bare = strip_prefix(line).strip()
        self._note_error(bare)
        if _is_marker(bare, START_MARKER):
            self._close(closed=False)
            self._block, self._block_bytes = [], 0
            tail = bare.split(START_MARKER, 1)[1].strip()
            if tail:  # record printed on the marker's own line by a sloppy writer
                self._block.append(tail)
        elif _is_marker(bare, END_MARKER) and self._block is not None:
            self._close(closed=True)
        elif self._block is not None:
            self._block_bytes += len(line)
            if self._block_bytes > MAX_RECORD_BYTES:
                self._problems.append(f"block between markers larger than {MAX_RECORD_BYTES >> 20} MiB: not a record")
                self._block = None
            else:
                self._block.append(bare)

    def _note_error(self, bare: str) -> None:
        if _ERROR_LINE.match(bare) and not bare.startswith("Traceback"):
            self._last_error = bare[:300]

    def _close(self, closed: bool) -> None:
        block, self._block = self._block, None
        if block is None:
            return
        found, error = _candidates(block)
        if error:
            self._problems.append(error if closed else "record truncated (START marker without END)")
        for obj in found:
            why = validate(obj)
            if why:
                self._problems.append(why)
                continue
            self._valid += 1
            self._last = obj
            if closed and self.record_seen_at is None:
                self.record_seen_at = time.monotonic()
            if self.run_id is not None and obj.get("run_id") == self.run_id:
                self._last_matching = obj

    def result(self) -> Extracted:
        self._close(closed=False)
        out = Extracted()
        if self._last is not None:
            out.record = self._last_matching or self._last
            if self._valid > 1:
                out.notes.append(f"{self._valid} records in the log; took the last"
                                 + (" matching run id" if self._last_matching is not None else ""))
            out.notes += [f"ignored: {p}" for p in self._problems]
            return out
        out.error = self._problems[-1] if self._problems else "no result record in the log"
        if self._last_error:
            out.error += f"; last error line: {self._last_error}"
        return out


def _candidates(block: list[str]) -> tuple[list[Any], str | None]:
    """Records in one block: whole JSON lines that are valid, else the pieces rejoined."""
    found, first_error = [], None
    for line in block:
        if line.startswith("{"):
            try:
                obj = _decode_object(line)
            except ValueError as exc:
                first_error = first_error or f"invalid JSON: {exc}"
                continue
            if validate(obj) is None:
                found.append(obj)
    if found:
        return found, None
    starts = [i for i, line in enumerate(block) if line.startswith("{")][:5]
    budget = [_SEARCH_STEPS, _SEARCH_BYTES]  # shared by every start: one block, one bounded search
    for start in starts:  # a foreign JSON line may come first: each `{` line may open the record
        pieces = block[start:][:_MAX_PIECES]
        try:
            joined = _decode_object("".join(pieces))
        except ValueError as exc:
            joined, first_error = None, first_error or f"invalid JSON: {exc}"
        if joined is not None and validate(joined) is None:
            return [joined], None
        rejoined = _rejoin(pieces, budget)
        if rejoined is not None:
            return [rejoined], None
        if joined is not None and start == starts[-1]:
            return [joined], None  # not a record: the caller says why
    return [], first_error or "no JSON object between the markers"


def iter_lines(stream: BinaryIO):
    """The stream's lines, none longer than MAX_LINE_BYTES (a longer one comes in pieces)."""
    while True:
        line = stream.readline(MAX_LINE_BYTES)
        if not line:
            return
        yield line


def extract(data: bytes | str, run_id: str | None = None) -> Extracted:
    """Find the record in a log held in memory (rules in the module docstring)."""
    if isinstance(data, str):
        collector = Collector(run_id)
        for line in data.splitlines():
            collector.feed(line)
        return collector.result()
    return extract_stream(io.BytesIO(data), run_id)


def extract_stream(stream: BinaryIO, run_id: str | None = None) -> Extracted:
    collector = Collector(run_id)
    for line in iter_lines(stream):
        collector.feed(line)
    return collector.result()


def extract_file(path: str | os.PathLike, run_id: str | None = None) -> Extracted:
    """Find the record in a log file, streaming; an unreadable file is an error, not a raise."""
    try:
        with open(path, "rb") as fh:
            return extract_stream(fh, run_id)
    except OSError as exc:
        return Extracted(error=f"cannot read {path}: {exc.strerror or exc}")


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
        rec.settings = knobs.settings(spec.run_config())
    if run_id:
        rec.run_id = run_id
    data = rec.to_dict()
    data.update(extra)
    return data
