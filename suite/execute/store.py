"""A results directory: the files of each run, locked while a suite writes to it.

Layout: <results>/<run-id>/{spec.json, log.txt, result.json, ...}, earlier attempts of a run under
<results>/<run-id>/attempts/<n>/, the order each invocation ran in <results>/order.jsonl, and the
lock file <results>/.shardbench.lock.

Rules (nothing measured is ever lost):
- One writer: `open()` takes an OS lock (flock) on the lock file and writes the owner's pid,
  host and start time into it; a second suite gets ResultsDirError naming that owner. The kernel
  drops the lock when the owner dies, so a crash never leaves a stale lock.
- A directory that cannot be created or written is a ResultsDirError at `open()`, before any run.
- A new attempt never overwrites an old one: `begin()` moves every file of the previous attempt
  into attempts/<n>/ first (an ok result kept by --force included).
- Resume trusts only a result.json that reads, has a schema version this reader knows, status ok
  or oom, and belongs to this exact run: its run id and measured fields equal the spec's, and the
  saved spec.json equals the spec (only the timeout may differ).
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from shardbench.trainer import contract, knobs
from shardbench.trainer.record import write_atomic
from shardbench.suite.execute.collect import validate
from shardbench.suite.matrix.expand import RunSpec

LOCK_NAME = ".shardbench.lock"
KEEP_STATUSES = ("ok", "oom")
"""Outcomes a rerun would repeat: resume keeps them. failed/timeout/cancelled run again."""
ATTEMPT_FILES = ("result.json", "log.txt", "spec.json", "collect-notes.txt", "hostfile", "trainer-output")
"""What one attempt leaves in its run directory (moved aside before the next attempt)."""
# Record field -> RunSpec field that must agree for a result to belong to a spec.
_SAME = (("run_id", "run_id"), ("strategy", "strategy"), ("world_size", "world_size"),
         ("seq_len", "seq_len"), ("micro_batch", "micro_batch"), ("grad_accum", "grad_accum"),
         ("steps", "steps"), ("warmup_steps", "warmup_steps"), ("seed", "seed"), ("repeat", "repeat"),
         ("config_id", "config_id"))


class ResultsDirError(Exception):
    """The results directory cannot be used (one line: what and how to fix it)."""


def read_json(path: Path) -> Any:
    """Parsed JSON of `path`; ValueError (with the reason) for anything unreadable or unparsable,
    nesting too deep for the parser included."""
    if path.exists() and not path.is_file():  # a FIFO would block the suite, /dev/zero never ends
        raise ValueError("not a regular file")
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise ValueError(exc.strerror or str(exc)) from None
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc).splitlines()[0][:120]})") from None


class ResultsDir:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock_fd: int | None = None

    # -- lock -----------------------------------------------------------------------------------
    def open(self) -> "ResultsDir":
        """Create and lock the directory; ResultsDirError when it is unusable or taken."""
        if self._lock_fd is not None:
            return self
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ResultsDirError(f"results directory {self.path} is unusable ({exc.strerror or exc}): "
                                  "give a writable directory with --results") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise ResultsDirError(f"results directory {self.path} is in use by {owner}: wait for it to "
                                  "finish or give another --results directory") from None
        except OSError as exc:  # e.g. ENOLCK: a filesystem without locks cannot be shared safely
            os.close(fd)
            raise ResultsDirError(f"results directory {self.path} cannot be locked ({exc.strerror or exc}): "
                                  "give a directory on a local filesystem with --results") from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                         f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode())
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise ResultsDirError(f"results directory {self.path} is unusable ({exc.strerror or exc}): "
                                  "free some space or give another directory with --results") from None
        self._lock_fd = fd
        return self

    def close(self) -> None:
        """Release the lock (the file stays: removing it would race a waiting suite)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = None

    def __enter__(self) -> "ResultsDir":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- runs -----------------------------------------------------------------------------------
    def run_dir(self, spec: RunSpec) -> Path:
        return self.path / spec.run_id

    def trusted(self, spec: RunSpec) -> tuple[dict | None, str]:
        """(the record resume may keep, "") or (None, why not; "" when there is no result)."""
        run_dir = self.run_dir(spec)
        if not (run_dir / "result.json").exists():
            return None, ""
        try:
            record = read_json(run_dir / "result.json")
        except ValueError as exc:
            return None, f"result.json unreadable: {exc}"
        why = validate(record)
        if why:
            return None, f"result.json not usable: {why}"
        if record["status"] not in KEEP_STATUSES:
            return None, f"previous attempt {record['status']}"
        for field, attr in _SAME:
            want, have = getattr(spec, attr, None), record.get(field)
            if want not in (None, "") and have not in (None, "") and want != have:
                return None, f"result.json belongs to another run ({field} {have!r}, this run has {want!r})"
        try:
            saved = read_json(run_dir / "spec.json")
        except ValueError as exc:
            return None, f"spec.json unreadable: {exc}"
        if _differs(saved, json.loads(json.dumps(spec.to_dict()))):
            return None, "spec.json differs from this run's spec"
        return record, ""

    def older_ids(self) -> list[str]:
        """Run directories whose spec.json was keyed by another config id version (a run id
        made by an older shardbench): resume would not find them under this version's ids."""
        out = []
        for path in sorted(self.path.glob("*/spec.json")):
            try:
                saved = read_json(path)
            except ValueError:
                continue  # unreadable: trusted() reports it when its run comes up
            if isinstance(saved, dict) and saved.get("config_id_version") != contract.CONFIG_ID_VERSION:
                out.append(path.parent.name)
        return out

    def begin(self, spec: RunSpec) -> Path:
        """The run's directory, emptied of any earlier attempt (moved to attempts/<n>/), with
        this attempt's spec.json. Raises OSError; then nothing of the old attempt was lost."""
        run_dir = self.run_dir(spec)
        run_dir.mkdir(parents=True, exist_ok=True)
        _set_aside(run_dir)
        write_atomic(spec.to_dict(), str(run_dir / "spec.json"))
        return run_dir

    def reinstate(self, spec: RunSpec, attempt: Path) -> None:
        """Put an earlier attempt (attempts/<n>/) back as the run's result, the current attempt
        set aside in its place: a re-measure cancelled before it measured anything must not leave
        the run without its good result. Raises OSError."""
        run_dir = self.run_dir(spec)
        hidden = attempt.with_name(f".{attempt.name}")
        os.replace(attempt, hidden)  # its number is free: the current attempt takes it
        _set_aside(run_dir)
        for path in hidden.iterdir():
            os.replace(path, run_dir / path.name)
        hidden.rmdir()

    def save(self, spec: RunSpec, record: dict) -> None:
        """Write the run's result.json (atomic, 0644); raises OSError."""
        write_atomic(record, str(self.run_dir(spec) / "result.json"))

    def log_order(self, seed: int, run_ids: list[str]) -> None:
        """Append this invocation's run order and its seed to order.jsonl (raises OSError)."""
        line = json.dumps({"started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "order_seed": seed, "order": run_ids})
        with open(self.path / "order.jsonl", "a") as fh:
            fh.write(line + "\n")


def _set_aside(run_dir: Path) -> Path | None:
    """Move the attempt in run_dir to attempts/<next n>/ (None when there is none)."""
    previous = [name for name in ATTEMPT_FILES if (run_dir / name).exists()]
    if not previous:
        return None
    attempts = run_dir / "attempts"
    attempts.mkdir(exist_ok=True)
    n = 1 + max((int(p.name) for p in attempts.iterdir() if p.name.isdigit()), default=0)
    target = attempts / str(n)
    target.mkdir()
    for name in previous:
        os.replace(run_dir / name, target / name)
    return target


def last_attempt(run_dir: Path) -> Path | None:
    """attempts/<highest n>/ of a run directory, or None."""
    found = [p for p in (run_dir / "attempts").glob("*") if p.name.isdigit()] if (run_dir / "attempts").is_dir() else []
    return max(found, key=lambda p: int(p.name)) if found else None


def _differs(saved: Any, now: dict) -> bool:
    """Whether a saved spec.json is another run than `now` (a new timeout is the same run). A
    knob the saved spec lacks (added to RunConfig since) is the same run when `now` has it at
    its default, as its config id says."""
    if not isinstance(saved, dict):
        return True
    for key in set(saved) | set(now):
        if key == "timeout_s":
            continue
        if key not in saved and key in _KNOBS and now[key] == knobs.default(key):
            continue
        if saved.get(key, _ABSENT) != now.get(key, _ABSENT):
            return True
    return False


_ABSENT = object()
_KNOBS = {f.name for f in knobs.knob_fields()}


def _read_owner(fd: int) -> str:
    try:
        text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    except OSError:
        text = ""
    return f"another shardbench ({text})" if text else "another shardbench"
