"""Predictions kept between runs. Planning a matrix starts a process that imports torch and
traces every distinct input (3-4 s on this 2-core machine, before every `shardbench run` and
every benchtui matrix), yet a prediction depends only on its job and the planner's code. So each
one is kept as a file under the cache directory, named by a hash of its job (the planner's input,
the device memory, the links, the resolved layout) and of a fingerprint of the code: every
source file under trainer/ (the planner, the model it traces, the strategies) and the installed
torch and DeepSpeed versions. An edit to any of them changes every name: no old answer is served.

The fingerprint follows the files' sizes and modification times, so a long-lived process
(benchtui) sees an edit too; the source is hashed again only when they change. A kept plan's
file is touched when read; files unread for MAX_AGE_DAYS, and the least recently used beyond
MAX_FILES, are removed when a plan is kept (the first time in a process).

A failed plan ({"error": ...}) is never kept (it may have been the machine's, not the input's).
`SHARDBENCH_CACHE_DIR` moves the cache (default `$XDG_CACHE_HOME/shardbench`, else
`~/.cache/shardbench`); `SHARDBENCH_CACHE_DIR=off` turns it off."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from importlib import metadata
from pathlib import Path

TRAINER = Path(__file__).resolve().parents[2] / "trainer"
CACHE_ENV = "SHARDBENCH_CACHE_DIR"
MAX_AGE_DAYS = 30
MAX_FILES = 5000
"""A plan file is a few kB: the cache stays under about 50 MB."""


def cache_dir() -> Path | None:
    """Where predictions are kept, or None when the cache is off."""
    where = os.environ.get(CACHE_ENV)
    if where == "off":
        return None
    if where:
        return Path(where) / "plans"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "shardbench" / "plans"


def code_fingerprint() -> str:
    """A hash of what a prediction is computed by: trainer/'s sources and torch's and DeepSpeed's
    versions (read from the installed metadata: no torch import)."""
    sources = sorted(TRAINER.rglob("*.py"))
    return _fingerprint(tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sources))


@functools.lru_cache(maxsize=4)
def _fingerprint(stats: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for path, _, _ in stats:
        digest.update(str(Path(path).relative_to(TRAINER)).encode() + b"\0" + Path(path).read_bytes() + b"\0")
    for dist in ("torch", "deepspeed"):
        try:
            digest.update(f"{dist}={metadata.version(dist)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=none".encode())
    return digest.hexdigest()


def _path(job_key: str) -> Path | None:
    where = cache_dir()
    if where is None:
        return None
    name = hashlib.sha256((code_fingerprint() + "\0" + job_key).encode()).hexdigest()[:32]
    return where / f"{name}.json"


def load(job_key: str) -> dict | None:
    """The kept prediction of this job, or None (none kept, the cache off, or unreadable)."""
    path = _path(job_key)
    try:
        prediction = json.loads(path.read_text()) if path else None
        if path:
            os.utime(path)  # recently used: pruned last
        return prediction
    except (OSError, ValueError):
        return None


def keep(job_key: str, prediction: dict) -> None:
    """Keep a prediction (not a failed one). A cache that cannot be written is skipped: it only
    saves time."""
    path = _path(job_key)
    if path is None or "error" in prediction:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(prediction))
        os.replace(tmp, path)  # whole or absent: another process may be reading it
    except OSError:
        return
    _prune_once(path.parent)


@functools.lru_cache(maxsize=None)
def _prune_once(where: Path) -> None:
    prune(where)


def prune(where: Path, max_age_days: float = MAX_AGE_DAYS, max_files: int = MAX_FILES) -> int:
    """Remove plans unread for `max_age_days` and the least recently used beyond `max_files`;
    returns how many went. Another process may remove the same file: that is not an error."""
    try:
        files = sorted(((f.stat().st_mtime, f) for f in where.glob("*.json")), reverse=True)
    except OSError:
        return 0
    oldest = time.time() - max_age_days * 86400
    gone = [f for k, (mtime, f) in enumerate(files) if k >= max_files or mtime < oldest]
    for f in gone:
        try:
            f.unlink()
        except OSError:
            pass
    return len(gone)
