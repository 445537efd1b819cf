"""Before a checkpointing run measures anything (rank 0, from trainer.cli.check; exit 2 on each):
- the checkpoint directory is writable (a probe file is written and removed), so a read-only or
  full volume is found at start, not at the first save;
- it is locked for the run's life (`.lock`, flock; it names the owner's pid, host and start), so
  two runs sharing it cannot adopt each other's checkpoints;
- the checkpoint the run would resume from was saved with the same measured settings
  (trainer.config.measured_fields; a resumed run keeps the saved optimizer, scheduler and
  history, so any other value would be recorded but not applied). `--resume-allow` lets through
  the changes listed in ALLOWABLE, which a resumed run does apply.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from shardbench.trainer.fsprobe import probe_writable
from shardbench.trainer.config import ConfigError, RunConfig, measured_fields
from shardbench.trainer.contract import is_deepspeed

LOCK = ".lock"
LOCK_WAIT_S = 15.0
"""How long a run waits for the lock before it is refused ($SHARDBENCH_CKPT_LOCK_WAIT_S)."""
ALLOWABLE = {
    "world_size": ("world_size", "nodes", "launcher", "micro_batch", "grad_accum"),
    "steps": ("steps",),
    "checkpointing": ("checkpoint_every", "keep_checkpoints", "async_checkpoint"),
}
"""--resume-allow names -> the measured fields each lets differ. world_size: ddp and fsdp
checkpoints load at another world size with the same global batch (DeepSpeed's ZeRO partitions
do not); steps: run longer or shorter (the LR schedule is rebuilt for the new length);
checkpointing: save at another interval, keep another number, save asynchronously."""

_held: list[int] = []  # the lock's file descriptor, open until the process exits
_settings: dict[str, Any] = {}  # this run's measured settings, taken before any process group


def measured_now(cfg: RunConfig, world_size: int, local_world_size: int, launcher: str | None) -> dict[str, Any]:
    """The measured settings of this run as trainer_state.json stores them (JSON round trip)."""
    nodes = max(1, world_size // max(1, local_world_size))
    return json.loads(json.dumps(measured_fields(cfg, world_size, nodes, cfg.launcher or launcher)))


def lock(path: Path) -> None:
    """Hold `path/.lock` until this process exits; refuse when another live process still holds
    it after LOCK_WAIT_S (a retried launcher may start while the failed attempt's rank 0 is
    still being ended)."""
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + float(os.environ.get("SHARDBENCH_CKPT_LOCK_WAIT_S", LOCK_WAIT_S))
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError:
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            owner = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"--checkpoint-dir {path} is in use by {owner}: wait for that run to end or give "
                              "another --checkpoint-dir") from None
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} (since {started})\n".encode(), 0)
    _held.append(fd)


def allowed_fields(spec: str | None) -> set[str]:
    names = [n.strip() for n in (spec or "").split(",") if n.strip()]
    unknown = [n for n in names if n not in ALLOWABLE]
    if unknown:
        raise ConfigError(f"--resume-allow {unknown[0]} is not one of {','.join(ALLOWABLE)}")
    return {f for n in names for f in ALLOWABLE[n]}


def differences(saved: dict[str, Any], now: dict[str, Any], allowed: set[str]) -> list[str]:
    return [f"{k} {saved.get(k)!r} -> {now.get(k)!r}" for k in sorted(set(saved) | set(now))
            if k not in allowed and saved.get(k) != now.get(k)]


def check_resume(cfg: RunConfig, now: dict[str, Any]) -> None:
    """Refuse a resume whose checkpoint was saved with other measured settings (one line)."""
    from shardbench.trainer.checkpoint import choose  # imports torch: only runs that resume pay for it

    allowed = allowed_fields(cfg.resume_allow)
    root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else Path(cfg.resume).parent
    try:
        path, _, _ = choose(root, cfg.resume)
    except RuntimeError as exc:  # --resume PATH that does not verify
        raise ConfigError(str(exc)) from None
    if path is None:
        return
    state = json.loads((path / "trainer_state.json").read_text())
    saved = state.get("measured")
    if saved is None:  # saved before settings were stored: the engine key is checked at load
        return
    if is_deepspeed(cfg.strategy) and saved.get("world_size") != now.get("world_size"):
        allowed -= set(ALLOWABLE["world_size"])  # ZeRO partitions are laid out per world size
    diff = differences(saved, now, allowed)
    if diff:
        raise ConfigError(f"--resume: checkpoint {path} was saved with other measured settings ("
                          + "; ".join(diff) + "): run with the same settings, another --checkpoint-dir or "
                          "--resume never (--resume-allow {" + ",".join(ALLOWABLE) + "} lets some change)")


def prepare(cfg: RunConfig, world_size: int, local_world_size: int, launcher: str | None) -> None:
    """Rank 0, before anything is measured: probe and lock the checkpoint directory, then check
    the checkpoint a resume would load."""
    if cfg.checkpoint_dir:
        root = Path(cfg.checkpoint_dir)
        probe_writable(root, "--checkpoint-dir")
        lock(root)
    _settings.clear()
    _settings.update(measured_now(cfg, world_size, local_world_size, launcher))
    if cfg.resume != "never":
        check_resume(cfg, dict(_settings))


def settings_to_save(cfg: RunConfig, world_size: int) -> dict[str, Any]:
    """What trainer_state.json stores: the settings prepare() saw. They are taken from the
    launcher's environment at start: DeepSpeed's init later adds RANK/WORLD_SIZE to it, which
    would make a deepspeed-launched run look torchrun-launched."""
    if _settings:
        return dict(_settings)
    from shardbench.trainer.dist_env import detect  # a Trainer used in-process, without trainer.cli

    d = detect()
    return measured_now(cfg, world_size, d.local_world_size, d.launcher)
