"""What a run has measured so far on this rank, and the loop's side of checkpointing: a resumed
run restores its history from the checkpoint, so its record covers the whole run."""
from __future__ import annotations

from dataclasses import dataclass, field

from shardbench.trainer.checkpoint import Checkpointer
from shardbench.trainer.config import RunConfig
from shardbench.trainer.process import mean_over_ranks
from shardbench.trainer.record import CheckpointCost, ResultRecord


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
            stats.save_s = list(saved["save_s"]) + stats.save_s
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
            blocked = self.ckpt.save(done, self._saved_history())
            if dt is not None:
                self.h.ckpt_step_times[-1] += blocked
        return due or in_flight

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
        s = self.ckpt.stats
        return CheckpointCost(
            every=cfg.checkpoint_every, keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint,
            saves=s.saves, save_s_mean=sum(s.save_s) / len(s.save_s) if s.save_s else None,
            save_s_max=max(s.save_s, default=None),
            blocking_s_mean=sum(s.blocking_s) / len(s.blocking_s) if s.blocking_s else None,
            load_s=s.load_s, size_bytes_per_rank=list(s.sizes), size_bytes=sum(s.sizes) if s.sizes else None,
            resumed_from_step=s.resumed_step, restarts=self.h.restarts, step_time_s=list(self.h.ckpt_step_times))
