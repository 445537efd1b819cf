"""Checkpoints: save, load, verify and rotate what a run needs to continue exactly where it was.

A checkpoint is a directory `<checkpoint-dir>/step-00000012/` holding:
- the engine's state: ddp and fsdp through torch.distributed.checkpoint (`dcp/`: model and
  optimizer, sharded by rank, so an fsdp checkpoint loads at another world size), ZeRO-1/2/3
  through DeepSpeed's own save_checkpoint (`deepspeed/`: module, ZeRO partitions, LR scheduler);
- `rng-rank<R>.pt`: every rank's RNG states (torch CPU and CUDA, Python, NumPy);
- `trainer_state.json`: the step (= the data position: tokens depend only on the step), the LR
  scheduler (torch strategies), and the history the final record needs (losses averaged over
  ranks, measured step times, checkpoint costs, restarts);
- `manifest.json`, written last: every file's size, sha256 and writing rank.
Files on disk (commit, verify, rotate) are trainer/checkpoint_files.py's.

Atomic: everything is written into `.tmp-step-00000012/`, every file and the directory are
fsynced, the manifest is written, and only then is the directory renamed into place. A crash
leaves at most a `.tmp-*` directory, which resume ignores. On resume every file is checked
against the manifest; a checkpoint that fails is skipped for the one before it, with a warning,
and is remembered as rejected: the save that reaches its step replaces it, rotation deletes it.
"""
from __future__ import annotations

import errno
import json
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from shardbench.trainer import contract

from shardbench.trainer.checkpoint_files import (DS_TAG, MANIFEST, STATE, TMP_PREFIX, commit, committed,  # noqa: F401
                                      no_space, rotate, step_dir_name, verify)


def sizes_per_rank(manifest: dict[str, Any], world_size: int) -> list[int]:
    out = [0] * world_size
    for meta in manifest["files"].values():
        out[min(meta["rank"], world_size - 1)] += meta["size"]
    return out


def choose(root: Path, resume: str) -> tuple[Path | None, list[str], list[str]]:
    """The checkpoint to resume from, warnings about the ones passed over, and the names of those
    rejected (every one newer than the choice). `resume`: never, auto (the newest valid one
    under `root`, or none) or a checkpoint directory."""
    if resume == "never":
        return None, [], []
    if resume != "auto":
        path = Path(resume)
        problem = verify(path)
        if problem:
            raise RuntimeError(f"--resume {resume}: {problem}")
        return path, [], []
    warnings = [f"checkpoint {p.name} ignored: never committed (the run stopped while writing it)"
                for p in sorted(root.glob(TMP_PREFIX + "*"))] if root.is_dir() else []
    rejected: list[str] = []
    for _, path in committed(root):
        problem = verify(path)
        if problem is None:
            return path, warnings, rejected
        rejected.append(path.name)
        warnings.append(f"checkpoint {path.name} skipped: {problem}; trying the one before it")
    return None, warnings, rejected


def tied_aliases(model_sd: dict[str, Any]) -> dict[str, str]:
    """{key: the earlier key whose tensor it shares}: a tied weight (TinyGPT's lm_head is its
    token embedding) appears under both names in a state dict, and DCP would store it twice."""
    first: dict[tuple, str] = {}
    aliases = {}
    for key, value in model_sd.items():
        local = value.to_local() if hasattr(value, "to_local") else value
        if not isinstance(local, torch.Tensor) or local.numel() == 0:
            continue
        where = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape), local.dtype)
        if where in first:
            aliases[key] = first[where]
        else:
            first[where] = key
    return aliases


# --- what the loop hands over ---------------------------------------------------------------

def rng_state() -> dict[str, Any]:
    import numpy as np

    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def resume_key(cfg, world_size: int) -> dict[str, Any]:
    """What must match for a checkpoint to continue this run (the world size only for DeepSpeed,
    whose ZeRO partitions are laid out for the world size that wrote them)."""
    model = dict(cfg.model_config().__dict__)
    if model["tie_embeddings"]:  # tied: the key of checkpoints saved before the knob existed
        del model["tie_embeddings"]
    key = {"model": model, "seq_len": cfg.effective_seq_len(), "seed": cfg.seed,
           "global_batch": cfg.micro_batch * cfg.effective_grad_accum(world_size) * world_size,
           "engine": contract.STRATEGIES[cfg.strategy].engine, "strategy": cfg.strategy}
    if contract.is_deepspeed(cfg.strategy):
        key["world_size"] = world_size
    return key


@dataclass
class Stats:
    """What checkpointing cost this process (the record's `checkpoint`)."""

    saves: int = 0
    save_s: list[float] = field(default_factory=list)
    """Seconds of every save whose end this run saw (a checkpoint cannot hold its own)."""
    blocking_s: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    load_s: float | None = None
    resumed_from: str | None = None
    resumed_step: int | None = None


class Checkpointer:
    """Saves every `every` optimizer steps into `root`, keeps `keep`, and resumes. Engine-specific
    calls are the only difference between strategies."""

    def __init__(self, cfg, strategy, rank: int, world_size: int):
        self.cfg, self.strategy, self.rank, self.world = cfg, strategy, rank, world_size
        # Without --checkpoint-dir (--resume PATH alone) nothing is saved; PATH's parent is the root.
        self.root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else Path(cfg.resume).parent
        self.deepspeed = contract.is_deepspeed(cfg.strategy)
        self.stats = Stats()
        self.rejected: list[str] = []  # checkpoints resume skipped (rank 0): replaced or rotated away
        self._pending = None  # (future, tmp, final, started) of an async save in flight
        # An async save runs collectives from a background thread: on a group of its own, never
        # on the one the training step uses at the same moment.
        self._async_group = None
        if cfg.async_checkpoint and not self.deepspeed and self._group() and world_size > 1:
            self._async_group = dist.new_group(backend="gloo")

    # -- helpers ------------------------------------------------------------------------------
    def _group(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def _barrier(self) -> None:
        if self._group():
            dist.barrier()

    def _broadcast(self, obj):
        if self._group() and self.world > 1:
            box = [obj]
            dist.broadcast_object_list(box, src=0)
            return box[0]
        return obj

    def _measured(self) -> dict[str, Any]:
        """The run's measured settings, which a resume must match (trainer/checkpoint_guard.py)."""
        from shardbench.trainer.checkpoint_guard import settings_to_save

        return settings_to_save(self.cfg, self.world)

    def due(self, step: int) -> bool:
        return self.cfg.checkpoint_every > 0 and step % self.cfg.checkpoint_every == 0 and step < self.cfg.steps

    def in_flight(self) -> bool:
        return self._pending is not None

    def _model_optim(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The DCP state (model and optimizer) with tied parameters once, and {alias: key}."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.strategy.model, self.strategy.optimizer)
        aliases = tied_aliases(model_sd)
        for alias in aliases:
            del model_sd[alias]
        return {"model": model_sd, "optim": optim_sd}, aliases

    # -- save ---------------------------------------------------------------------------------
    def save(self, step: int, history: dict[str, Any]) -> float:
        """Write the checkpoint of `step` (all ranks call it). Returns the seconds the loop was
        blocked; an async save finishes in the background and is committed by poll()."""
        try:
            return self._save(step, history)
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            self._full(step, exc)
            raise

    def _full(self, step: int, exc: BaseException) -> None:
        """A save that ran out of space says so (torch's own errors often drop the errno); the
        partial checkpoint is removed so that result.json, perhaps on the same volume, fits."""
        if isinstance(exc, (KeyboardInterrupt, SystemExit)) or not no_space(self.root, exc):
            return
        if self.rank == 0:
            for partial in self.root.glob(TMP_PREFIX + "*"):
                shutil.rmtree(partial, ignore_errors=True)
        try:
            st = os.statvfs(self.root)
            free = f"{st.f_bavail * st.f_frsize // 1024} KiB free after removing the partial checkpoint"
        except OSError:
            free = "free space unknown"
        raise OSError(errno.ENOSPC, f"checkpoint of step {step} not written: no space left on device under "
                      f"{self.root} ({free}): free space or give another --checkpoint-dir") from exc

    def _save(self, step: int, history: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        self.stats.saves += 1
        self.wait()  # one save in flight at a time
        final, tmp = self.root / step_dir_name(step), self.root / (TMP_PREFIX + step_dir_name(step))
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self._barrier()
        torch.save(rng_state(), tmp / f"rng-rank{self.rank}.pt")
        if self.rank == 0:
            state = {"step": step, "key": resume_key(self.cfg, self.world), "world_size": self.world,
                     "measured": self._measured(), "history": history}
            if not self.deepspeed:
                state["scheduler"] = self.strategy.scheduler.state_dict()
            (tmp / STATE).write_text(json.dumps(state))
        if self.deepspeed:
            self.strategy.engine.save_checkpoint(str(tmp), tag=DS_TAG, save_latest=False)
        elif self.cfg.async_checkpoint:
            import torch.distributed.checkpoint as dcp

            future = dcp.async_save(self._model_optim()[0], checkpoint_id=str(tmp / "dcp"),
                                    process_group=self._async_group, no_dist=not self._group())
            self._pending = (future, tmp, final, t0)  # type: ignore[assignment]
            blocked = time.perf_counter() - t0
            self.stats.blocking_s.append(blocked)
            return blocked
        else:
            import torch.distributed.checkpoint as dcp

            dcp.save(self._model_optim()[0], checkpoint_id=str(tmp / "dcp"), no_dist=not self._group())
        self._finish(tmp, final, t0)
        blocked = time.perf_counter() - t0
        self.stats.blocking_s.append(blocked)
        return blocked

    def _finish(self, tmp: Path, final: Path, t0: float) -> None:
        """All ranks' files are written: rank 0 commits and rotates; every rank waits for it so
        that a checkpoint counts as saved only once it is in place."""
        self._barrier()
        sizes = None
        if self.rank == 0:
            sizes = sizes_per_rank(commit(tmp, final), self.world)
            rotate(self.root, self.cfg.keep_checkpoints, int(final.name.split("-")[1]), self.rejected)
            self.rejected = []  # replaced by this save or deleted by the rotation
        sizes = self._broadcast(sizes)
        self._barrier()
        self.stats.sizes = sizes
        self.stats.save_s.append(time.perf_counter() - t0)

    def poll(self) -> bool:
        """Commit an async save whose writes are done (every rank must agree: the commit is
        collective). Returns True while a save is still in flight."""
        if self._pending is None:
            return False
        done = self._pending[0].done()
        if self._group() and self.world > 1:
            # On the run's device: the default group is NCCL on GPUs, which refuses CPU tensors.
            flag = torch.tensor([1 if done else 0], device=self.strategy.ctx.device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)
            done = bool(flag.item())
        if done:
            self.wait()
        return self._pending is not None

    def wait(self) -> None:
        """Block until an async save in flight is written and committed."""
        if self._pending is None:
            return
        future, tmp, final, t0 = self._pending
        self._pending = None
        try:
            future.result()
            self._finish(tmp, final, t0)
        except BaseException as exc:
            self._full(int(final.name.split("-")[1]), exc)
            raise

    # -- load ---------------------------------------------------------------------------------
    def resume(self) -> tuple[int, dict[str, Any], list[str]]:
        """Load the checkpoint --resume names (all ranks). Returns (step to continue from, the
        saved history, warnings); (0, {}, warnings) when there is nothing to resume."""
        t0 = time.perf_counter()
        chosen = None
        if self.rank == 0:
            try:
                path, warnings, self.rejected = choose(self.root, self.cfg.resume)
                chosen = (str(path) if path else None, warnings, None)
            except RuntimeError as exc:
                chosen = (None, [], str(exc))  # type: ignore[assignment]
            for partial in self.root.glob(TMP_PREFIX + "*") if self.root.is_dir() else []:
                shutil.rmtree(partial, ignore_errors=True)  # never committed: debris of a crash
        path, warnings, error = self._broadcast(chosen)
        if error:
            raise RuntimeError(error)
        if path is None:
            return 0, {}, warnings
        path = Path(path)
        state = json.loads((path / STATE).read_text())
        if "attention" not in state["key"].get("model", {}):  # saved before q, k, v were split
            raise RuntimeError(f"checkpoint {path} holds the fused-qkv TinyGPT of an earlier shardbench (its "
                               "state-dict keys are gone): it cannot be resumed; use another --checkpoint-dir "
                               "or --resume never")
        if state["key"] != resume_key(self.cfg, self.world):
            raise RuntimeError(f"checkpoint {path} belongs to another configuration (saved {state['key']}, "
                               f"this run {resume_key(self.cfg, self.world)}): use another --checkpoint-dir "
                               "or --resume never")
        if self.deepspeed:
            loaded, _ = self.strategy.engine.load_checkpoint(str(path), tag=DS_TAG)
            if loaded is None:
                raise RuntimeError(f"DeepSpeed could not load the checkpoint in {path}")
        else:
            self._load_dcp(path / "dcp")
            self.strategy.scheduler.load_state_dict(state["scheduler"])
        rng_file = path / f"rng-rank{self.rank}.pt"
        if rng_file.is_file():  # absent when resuming at a larger world size
            set_rng_state(torch.load(rng_file, weights_only=False))
        self._barrier()
        self.stats.load_s = time.perf_counter() - t0
        self.stats.resumed_from, self.stats.resumed_step = str(path), state["step"]
        self.stats.sizes = sizes_per_rank(json.loads((path / MANIFEST).read_text()), self.world)
        return state["step"], state["history"], warnings

    def _load_dcp(self, path: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state, aliases = self._model_optim()
        dcp.load(state, checkpoint_id=str(path), no_dist=not self._group())
        for alias, key in aliases.items():
            state["model"][alias] = state["model"][key]
        set_state_dict(self.strategy.model, self.strategy.optimizer,
                       model_state_dict=state["model"], optim_state_dict=state["optim"])
