"""`shardbench tune`: its flags and the command; the studies, the re-measure and the outputs are
suite/tune/tuner.py."""
from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from shardbench.trainer.config import RunConfig
from shardbench.suite.backends import add_cluster_flags, cluster_options, get_backend
from shardbench.suite.cli.matrix_flags import add_matrix_flags, effective_matrix, fail


def _params(p: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.items())


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="per strategy, search the knobs under a memory limit (Optuna)")
    p.add_argument("--matrix", type=Path, help="the base matrix (default: the default matrix); one world size")
    add_matrix_flags(p)
    add_cluster_flags(p)
    p.add_argument("--trials", type=int, default=8, help="trials per strategy, the default configuration first")
    p.add_argument("--memory-limit-gib", type=float, default=None,
                   help="device memory per rank (GiB): configurations over it are rejected or infeasible")
    p.add_argument("--space", action="append", default=[], metavar="KEY=[V,...]",
                   help="search these values of a knob (YAML list), e.g. --space micro_batch=[2,4]")
    p.add_argument("--out", type=Path, default=Path("results/tune"),
                   help="trials, re-measures, TUNING.md, tuned-*.yaml")
    p.add_argument("--tune-seed", type=int, default=0, help="seed of the sampler")


def cmd_tune(args: argparse.Namespace) -> int:
    from shardbench.suite.report import tune_section as tune_report
    from shardbench.suite.tune.tuner import Tuner, batch_axis_errors, write_outputs

    try:
        base = effective_matrix(args)
        space = {}
        for item in args.space:
            key, _, value = item.partition("=")
            values = yaml.safe_load(value)
            if not key or not isinstance(values, list) or not values:
                raise ValueError(f"--space {item!r}: use KEY=[V1,V2]")
            space[key.strip()] = values
    except (OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        return fail(str(exc))
    if len(base.world_sizes) != 1:
        return fail(f"tune searches at one world size, the matrix has {base.world_sizes}: give --world-sizes N")
    if args.trials < 1:
        return fail(f"--trials must be at least 1, got {args.trials}")
    unknown = sorted(set(space) - {f.name for f in fields(RunConfig)})
    if unknown:
        return fail(f"--space: unknown knob(s) {', '.join(unknown)} (any trainer.config.RunConfig field)")
    world = base.world_sizes[0]
    per_rank = base.global_batch // world if base.global_batch else base.micro_batch * (base.grad_accum or 1)
    batch = batch_axis_errors(per_rank, space)
    if batch:
        return fail(batch[0])
    backend = get_backend(base.backend, cluster_options(args), base.ray_cluster)
    ok, why = backend.availability()
    if not ok:
        return fail(f"backend {base.backend} unavailable: {why}")
    limit = int(args.memory_limit_gib * 2**30) if args.memory_limit_gib else None
    tuner = Tuner(base, backend, args.out, limit, args.trials, base.repeats, space, args.tune_seed)
    try:
        tuner.spec_for(base.strategies[0], tuner.default_params(base.strategies[0]))
    except ValueError as exc:
        return fail(f"invalid base matrix: {exc}")
    results = []
    for strategy in base.strategies:
        tuning = tuner.study(strategy)
        tuner.remeasure(tuning)
        results.append(tuning)
        default = (f"breaks the limit ({tuning.default_over}), not run" if tuning.default_over
                   else f"{tune_report._fmt(tuning.default_est)} tok/s")
        print(f"{strategy}: default {default}; tuned {_params(tuning.best or {}) or 'none within the limit'}: "
              f"{tune_report._fmt(tuning.tuned_est)} tok/s", flush=True)
    print(f"tuning: {write_outputs(tuner, results)}")
    return 0 if all(t.best for t in results) else 1
