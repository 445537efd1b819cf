"""What a run has measured so far on this rank, and the loop's side of checkpointing: a resumed
run restores its history from the checkpoint, so its record covers the whole run."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from shardbench.trainer.checkpoint import Checkpointer
from shardbench.trainer.config import RunConfig
from shardbench.trainer.process import mean_over_ranks
from shardbench.trainer.record import CheckpointCost, ResultRecord

SAVE_TIMES = "save_times.json"
"""In the checkpoint root: the seconds of every committed save, by step (rank 0 writes it). A
checkpoint's history holds the saves that ended before it was written, never its own: a resumed
run reads its own time (and the history's) from here, so save_s_mean covers every attempt."""


@dataclass
class History:
    losses: list[float] = field(default_factory=list)
    """Loss of every step, rank-local until the record averages them over ranks."""
    grad_norms: list[float | None] = field(default_factory=list)
    """Global gradient norm of every step before clipping (the same on every rank); None where
    it was not finite (an fp16 overflow step)."""
    step_times: list[float] = field(default_factory=list)
    """Measured steps that were not checkpoint steps, seconds."""
    ckpt_step_times: list[float] = field(default_factory=list)
    """Measured steps that saved (or ran beside an async save), seconds."""
    restarts: int = 0
    measured_here: int = 0
    """Measured steps this process ran (a resumed run restores the rest)."""
    time_to_first_step: float | None = None
    comm_per_step: dict = field(default_factory=dict)


class CheckpointHooks:
    """Resume, save when due, and the checkpoint cost, around trainer.checkpoint.Checkpointer."""

    def __init__(self, ckpt: Checkpointer, history: History, world_size: int):
        self.ckpt, self.h, self.world_size = ckpt, history, world_size
        self._steps: list[int] = []  # steps this process saved, in commit order
        self._earlier = 0  # save times restored from earlier attempts (first in stats.save_s)
        self._noted = 0  # this process's save times already in SAVE_TIMES
        self._times: dict[str, float] = {}  # step -> seconds: the resumed timeline's and this process's

    def resume(self, record: ResultRecord) -> int:
        """The step to start from; the state is loaded and the history restored when --resume
        finds a checkpoint."""
        step, saved, warnings = self.ckpt.resume()
        record.warnings += warnings
        if saved:
            h, stats = self.h, self.ckpt.stats
            h.losses, h.step_times = list(saved["losses"]), list(saved["step_times"])
            # A checkpoint saved before gradient norms were recorded has none: None per step.
            h.grad_norms = list(saved.get("grad_norms", [None] * len(h.losses)))
            h.ckpt_step_times = list(saved["ckpt_step_times"])
            earlier = self._save_times_until(step, stats.resumed_from)
            stats.save_s = (earlier if earlier is not None else list(saved["save_s"])) + stats.save_s
            self._earlier = len(stats.save_s)
            stats.blocking_s = list(saved["blocking_s"]) + stats.blocking_s
            stats.saves = saved["saves"]
            h.restarts = saved["restarts"] + 1
        return step

    def after_step(self, done: int, dt: float | None) -> bool:
        """After step `done` (which took `dt`, None when not measured): save when due. True for a
        checkpoint step (one that saved, or ran beside an async save): its time, plus the part of
        the save the loop waited for, goes to the checkpoint's own list."""
        in_flight = self.ckpt.poll()
        due = self.ckpt.due(done)
        if dt is not None and (due or in_flight):
            self.h.ckpt_step_times.append(dt)  # before the save, so its history holds this step
        if due:
            self._steps.append(done)
            blocked = self.ckpt.save(done, self._saved_history())
            if dt is not None:
                self.h.ckpt_step_times[-1] += blocked
        self._note_save_times()
        return due or in_flight

    def _note_save_times(self) -> None:
        """Rank 0 adds the saves committed since last time to SAVE_TIMES (outside the timed step;
        an async save's time is known once it is committed)."""
        times = self.ckpt.stats.save_s[self._earlier + self._noted:]
        if not times or self.ckpt.rank != 0:
            return
        path = Path(self.ckpt.root) / SAVE_TIMES
        for step, seconds in zip(self._steps[self._noted:], times):
            self._times[str(step)] = seconds
        self._noted += len(times)
        known = {**_read_times(path), **self._times}  # a resume from another root brings its times
        try:
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text(json.dumps(known, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass  # only the resumed run's save_s_mean would miss these: the checkpoints are what counts

    def _save_times_until(self, step: int, resumed_from: str | None) -> list[float] | None:
        """The time of every save up to the resumed checkpoint's, in step order, from SAVE_TIMES
        beside that checkpoint (--resume may name one outside --checkpoint-dir); None when it
        lacks the checkpoint's own (then the checkpoint's history is all there is)."""
        root = Path(resumed_from).parent if resumed_from else Path(self.ckpt.root)
        known = _read_times(root / SAVE_TIMES)
        if str(step) not in known:
            return None
        self._times = {k: v for k, v in known.items() if int(k) <= step}
        return [self._times[k] for k in sorted(self._times, key=int)]

    def _saved_history(self) -> dict:
        """What a resumed run needs to report the whole run: losses averaged over ranks now
        (every rank holds the same list afterwards), gradient norms, measured step times, checkpoint
        costs."""
        h, s = self.h, self.ckpt.stats
        h.losses = mean_over_ranks(h.losses, self.world_size)
        return {"saves": s.saves + 1, "losses": h.losses, "grad_norms": h.grad_norms,
                "step_times": h.step_times, "ckpt_step_times": h.ckpt_step_times, "save_s": s.save_s,
                "blocking_s": s.blocking_s, "restarts": h.restarts}

    def cost(self, cfg: RunConfig) -> CheckpointCost:
        self._note_save_times()  # an async save committed after the loop
        s = self.ckpt.stats
        return CheckpointCost(
            every=cfg.checkpoint_every, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint,
            saves=s.saves, save_s_mean=sum(s.save_s) / len(s.save_s) if s.save_s else None,
            save_s_max=max(s.save_s, default=None),
            blocking_s_mean=sum(s.blocking_s) / len(s.blocking_s) if s.blocking_s else None,
            load_s=s.load_s, size_bytes_per_rank=list(s.sizes), size_bytes=sum(s.sizes) if s.sizes else None,
            resumed_from_step=s.resumed_step, resumed_from=_absolute(s.resumed_from),
            resumed_from_output_dir=_under(s.resumed_from, cfg.output_dir),
            restarts=self.h.restarts, step_time_s=list(self.h.ckpt_step_times))


def _absolute(path: str | None) -> str | None:
    return os.path.abspath(path) if path else None


def _under(path: str | None, output_dir: str | None) -> bool | None:
    """Whether checkpoint `path` lies inside `output_dir`, links resolved (None: no resume or no dir)."""
    if not path or not output_dir:
        return None
    return Path(path).resolve().is_relative_to(Path(output_dir).resolve())


def _read_times(path: Path) -> dict[str, float]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {k: float(v) for k, v in data.items() if k.isdigit() and isinstance(v, (int, float))} \
        if isinstance(data, dict) else {}
