"""The timed window and all that is in it: the copy of a step's batches to the device, every
micro-step's forward and backward, the update, and the wait for the device to finish them; plus
the one untimed step that samples model-state memory."""
from __future__ import annotations

import math
import time

import torch

from shardbench.trainer.metrics import peak_model_state
from shardbench.trainer.record import RankModelState
from shardbench.trainer.strategies import Strategy


class StepRunner:
    """Runs optimizer steps through a strategy and keeps the host-to-device copy statistics."""

    def __init__(self, strategy: Strategy, device: torch.device):
        self.strategy, self.device = strategy, device
        self.h2d_bytes = 0
        self.h2d_seconds = 0.0
        self._h2d_events = None  # (start, end, bytes) of the current step's copies (GPU only)
        self.tensor_peak: int | None = None  # this rank's live-tensor peak in the memory step
        self.tensor_start: int | None = None  # what was live when the memory step began

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def to_device(self, batches):
        if self.device.type != "cuda":
            return batches
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        moved = [(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)) for x, y in batches]
        end.record()
        self._h2d_events = (start, end, sum(x.nbytes + y.nbytes for x, y in batches))
        return moved

    def timed(self, host_batches) -> tuple[float, torch.Tensor]:
        """(seconds, summed micro-step loss) of one optimizer step, the device synchronised."""
        t0 = time.perf_counter()
        step_loss = self.step(host_batches)
        self.sync()
        return time.perf_counter() - t0, step_loss

    def step(self, host_batches) -> torch.Tensor:
        """One optimizer step: every micro-step's forward and backward, then the update."""
        batches = self.to_device(host_batches)
        if self.strategy.pipeline is not None:  # the schedule runs every micro-step (--pp)
            step_loss = self.strategy.pipeline_step(batches)
            self.strategy.step(True)
            return step_loss
        step_loss = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(batches):
            last = micro == len(batches) - 1
            step_loss += self.strategy.forward_backward(x, y, last)
            self.strategy.step(last)
        return step_loss

    def grad_norm(self) -> float | None:
        """The last step's global gradient norm before clipping, None where not finite (an fp16
        overflow step). Outside the timer: reading it synchronises with the device."""
        norm = self.strategy.grad_norm()
        return norm if norm is not None and math.isfinite(norm) else None

    def memory_step(self, host_batches) -> RankModelState:
        """One extra, untimed step that samples the model state after every micro-step's
        backward and after the optimizer step; returns the largest sample."""
        from shardbench.trainer.plan.live import LiveTensors  # the planner's instrument (tensor peak)

        samples = []
        batches = self.to_device(host_batches)
        tracker = LiveTensors(self.device.type)
        tracker.track_all_reachable()  # what exists already: parameters, optimizer state, buffers
        self.tensor_start = tracker.live  # (tests compare the rise above it with the allocator's)
        tracker.tag = "step"
        with tracker:
            if self.strategy.pipeline is not None:  # --pp: one sample after all micro-steps' backward
                self.strategy.pipeline_step(batches)
                samples.append(("micro-steps' backward (pipeline)", self.strategy.model_state()))
                self.strategy.step(True)
            for micro, (x, y) in enumerate(batches if self.strategy.pipeline is None else []):
                last = micro == len(batches) - 1
                self.strategy.forward_backward(x, y, last)
                samples.append((f"micro-step {micro} backward", self.strategy.model_state()))
                self.strategy.step(last)
        samples.append(("optimizer step", self.strategy.model_state()))
        self.sync()
        self.tensor_peak = tracker.peak
        return peak_model_state(samples)  # type: ignore[return-value]

    def count_h2d(self) -> None:
        """Add the last step's copies to the totals (measured steps only)."""
        if self._h2d_events:
            start, end, nbytes = self._h2d_events
            self.h2d_seconds += start.elapsed_time(end) / 1000.0
            self.h2d_bytes += nbytes

    @property
    def h2d_gbps(self) -> float | None:
        return self.h2d_bytes / self.h2d_seconds / 1e9 if self.h2d_seconds > 0 else None
