"""A checkpoint directory on disk: commit (fsync, manifest, rename), verify, list and rotate.

What a checkpoint holds is described in trainer/checkpoint.py. This module only knows files:
- `verify()` rejects a checkpoint whose manifest is unreadable or malformed, whose files differ
  from the manifest (missing, other size, other sha256), or that lacks a file the engine needs
  to load it (a file deleted together with its manifest entry): the loader then falls back to the
  checkpoint before it instead of crashing in the middle of a load.
- `commit()` never renames onto an existing directory: a rejected checkpoint at the same step
  (resume skipped it, the run saves that step again) is moved aside and deleted afterwards.
- `rotate()` counts only checkpoints that were not rejected, so the newest valid one is never
  deleted to keep a corrupt one.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

STEP_DIR = re.compile(r"^step-(\d{8})$")
TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".replaced-"
MANIFEST = "manifest.json"
STATE = "trainer_state.json"
DS_TAG = "deepspeed"
# Which rank wrote a file, from its name (DCP: __<rank>_<n>.distcp; DeepSpeed:
# zero_pp_rank_<rank>_...; ours: rng-rank<rank>.pt). Anything else is rank 0's.
_RANK_OF_FILE = (re.compile(r"__(\d+)_\d+\.distcp$"), re.compile(r"zero_pp_rank_(\d+)_"),
                 re.compile(r"rng-rank(\d+)\.pt$"))


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _rank_of(name: str) -> int:
    for pattern in _RANK_OF_FILE:
        m = pattern.search(name)
        if m:
            return int(m.group(1))
    return 0


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != MANIFEST)


# --- commit -----------------------------------------------------------------------------------

def commit(tmp: Path, final: Path) -> dict[str, Any]:
    """fsync every file of `tmp`, write its manifest, rename it to `final` (atomic on one file
    system) and fsync the parent so the rename survives a crash. Returns the manifest.

    A directory already at `final` (a checkpoint resume rejected, or one of an earlier run that
    this run saves again) is first renamed aside and removed only once `final` is in place."""
    files = {}
    for path in _files(tmp):
        _fsync(path)
        rel = path.relative_to(tmp).as_posix()
        files[rel] = {"size": path.stat().st_size, "sha256": _sha256(path), "rank": _rank_of(path.name)}
    for d in sorted({p.parent for p in tmp.rglob("*")} | {tmp}, key=lambda p: -len(p.parts)):
        _fsync(d)
    manifest = {"files": files}
    with open(tmp / MANIFEST, "w") as fh:
        json.dump(manifest, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync(tmp)
    aside = None
    if final.exists():
        aside = final.with_name(f"{OLD_PREFIX}{final.name}-{time.time_ns()}")
        os.rename(final, aside)
    os.rename(tmp, final)
    _fsync(final.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    return manifest


# --- verify -----------------------------------------------------------------------------------

def read_manifest(path: Path) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    """({relative path: {size, sha256, rank}}, None), or (None, why it cannot be used)."""
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError):
        return None, "no readable manifest (a partial checkpoint)"
    except ValueError as exc:
        return None, f"{MANIFEST} is not JSON ({exc})"
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        return None, f"{MANIFEST} is malformed (no 'files' object)"
    for rel, meta in files.items():
        ok = (isinstance(meta, dict) and isinstance(meta.get("size"), int) and isinstance(meta.get("sha256"), str)
              and isinstance(meta.get("rank", 0), int) and ".." not in Path(rel).parts and not Path(rel).is_absolute())
        if not ok:
            return None, f"{MANIFEST} is malformed (entry {rel!r})"
    return files, None


def _required(path: Path, files: dict[str, Any]) -> list[str]:
    """The files this checkpoint cannot load without, from its trainer_state.json: every rank's
    RNG file and the engine's files (DCP: .metadata and every file it references; DeepSpeed:
    every rank's ZeRO partition and the module states)."""
    state = json.loads((path / STATE).read_text())
    world = state["world_size"]
    if not isinstance(world, int) or world < 1:
        raise ValueError("world_size")
    need = [STATE] + [f"rng-rank{r}.pt" for r in range(world)]
    if state["key"]["engine"] == "deepspeed":
        for r in range(world):
            need.append(f"{DS_TAG}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        if f"{DS_TAG}/mp_rank_00_model_states.pt" not in files:  # ZeRO-3 writes one per rank
            need += [f"{DS_TAG}/zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
    else:
        need.append("dcp/.metadata")
        if "dcp/.metadata" in files and (path / "dcp/.metadata").is_file():
            import torch.distributed.checkpoint as dcp

            meta = dcp.FileSystemReader(str(path / "dcp")).read_metadata()
            need += sorted({f"dcp/{info.relative_path}" for info in meta.storage_data.values()})
    return need


def verify(path: Path) -> str | None:
    """Why the checkpoint at `path` cannot be trusted, or None when its manifest is well formed,
    lists every file the engine needs, and every file matches it (present, size, sha256)."""
    files, problem = read_manifest(path)
    if files is None:
        return problem
    if STATE not in files:
        return f"{STATE} is missing from the manifest"
    for rel, meta in files.items():
        f = path / rel
        if not f.is_file():
            return f"{rel} is missing"
        if f.stat().st_size != meta["size"]:
            return f"{rel} has {f.stat().st_size} bytes, the manifest says {meta['size']}"
        if _sha256(f) != meta["sha256"]:
            return f"{rel} does not match its sha256 (corrupt)"
    try:
        missing = [rel for rel in _required(path, files) if rel not in files]
    except Exception as exc:  # noqa: BLE001 - any unreadable state or metadata rejects the checkpoint
        return f"{STATE} or the engine's metadata is unreadable ({type(exc).__name__}: {exc})"
    if missing:
        return f"{missing[0]} is missing (with its manifest entry)" + (
            f" and {len(missing) - 1} more" if len(missing) > 1 else "")
    return None


# --- listing and rotation ---------------------------------------------------------------------

def committed(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of the checkpoint directories under `root`, newest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
    return sorted(found, reverse=True)


def rotate(root: Path, keep: int, head: int, rejected: Iterable[str] = ()) -> list[str]:
    """Keep the checkpoint of step `head` (just committed) and the `keep` - 1 newest valid ones
    before it; delete the rest. Deleted: checkpoints resume rejected (`rejected`: directory
    names), ones newer than `head` (a timeline this run replaced: resume must not jump into it),
    the oldest valid ones, and debris of replaced directories. Returns the names deleted."""
    rejected = set(rejected) - {step_dir_name(head)}
    gone, kept = [], 0
    for step, path in committed(root):
        stay = step <= head and path.name not in rejected and kept < keep
        kept += stay
        if not stay:
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path.name)
    for debris in root.glob(OLD_PREFIX + "*"):
        shutil.rmtree(debris, ignore_errors=True)
    return gone


def no_space(root: Path, exc: BaseException) -> bool:
    """Whether a failed save ran out of space: ENOSPC anywhere in the exception chain (torch
    and DCP wrap it, or keep only the text), or a volume left with less than 1 MiB."""
    todo: list[BaseException] = [exc]
    while todo:
        seen = todo.pop()
        if isinstance(seen, OSError) and seen.errno == errno.ENOSPC or "no space left" in str(seen).lower():
            return True
        todo += [e for e in (seen.__cause__, seen.__context__) if e is not None]
        # DCP's CheckpointException (a BaseException) carries each rank's (exception, trace).
        todo += [pair[0] for pair in getattr(seen, "failures", {}).values() if isinstance(pair, tuple)]
    try:
        st = os.statvfs(root)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)
