"""Run under torchrun: the trainer's ZeRO-3 engine at the given flags, three steps, and what
DeepSpeed itself says about prefetching (its coordinator's settings and its own prefetch submit
events, counted per step). Rank 0 prints one JSON line. Used by tests/trainer/test_matched_knobs.py."""
from __future__ import annotations

import collections
import json
import os
import sys

import torch.distributed as dist

from shardbench.trainer.config import parse_args
from shardbench.trainer.dist_env import detect
from shardbench.trainer.train import Trainer


class CountingProfiler:
    """Stands in for DeepSpeed's PartitionedParameterProfiler (a no-op without timers): counts events."""

    def __init__(self):
        self.counts = collections.Counter()

    def start_event(self, name):
        self.counts[name] += 1

    def stop_event(self, name, num_elem):
        pass

    def reset_events(self):
        pass

    def log_events(self):
        pass


def main() -> None:
    t = Trainer(parse_args([*sys.argv[1:], "--device", "cpu"]), detect(dict(os.environ)))
    t.init_process_group()
    t.build()
    engine = t.strategy.engine
    coord = engine.optimizer.parameter_offload.get_param_coordinator()
    profiler = CountingProfiler()
    coord._PartitionedParameterCoordinator__profiler = profiler
    per_step = []
    for step in range(3):
        profiler.counts.clear()
        for x, y in t.data.step_batches(step):
            _, loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        per_step.append(dict(profiler.counts))
    if dist.get_rank() == 0:
        state = {name.split("__")[-1]: value for name, value in vars(coord).items()
                 if name.endswith(("prefetch_bucket_sz", "max_n_available_params", "max_reuse_dist_in_numel"))}
        persistent = [n for n, p in t.strategy.model.named_parameters() if p.ds_persist]
        print(json.dumps({"coordinator": state, "events": per_step, "persistent": persistent}), flush=True)
    dist.barrier()


if __name__ == "__main__":
    main()
