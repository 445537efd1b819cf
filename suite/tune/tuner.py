"""`shardbench tune`: each strategy at its best, under a device-memory limit, so that strategies
are compared tuned rather than at one hand-picked micro-batch.

Per strategy, an Optuna study (TPE, seeded) searches the knobs of SPACE at the matrix's one world
size and fixed global batch, maximising measured tokens/s. Micro-batch and grad-accum are one
axis there (micro-batch x grad-accum = the per-rank batch, so every trial trains the same tokens
to the same loss): micro-batch is searched and grad-accum follows, or, with `--space
grad_accum=[...]`, grad-accum is searched and micro-batch follows; every trial records both.
- The space: micro-batch, activation checkpointing and the layout knobs that act on the layout
  (APPLIES, from the contract's strategy attributes: engine, sharded state).
- Memory limit: before launching, the planner predicts the peak per rank; a configuration
  predicted over the limit is never run, the default included (`trial.set_constraint("memory",
  predicted - limit)`, objective 0). After a run the measured live-tensor peak (the quantity the
  planner predicts) sets the constraint instead. The prediction is suite/matrix/planning.py
  `peak_bytes_per_rank` (trainer/plan's trace and closed forms).
- Pruning: a trial's running tokens/s is reported every measured step and Optuna's
  MedianPruner cancels a trial slower than the median of earlier trials at that step, never
  before MIN_PRUNE_STEPS measured steps.
- Trials are runs of any backend through the runner (locally one after another), into
  <out>/trials/; a trial repeated by the sampler reuses its finished result (resume).
Then the best configuration and the default one are re-measured `repeats` times each,
interleaved, into <out>/remeasure/, whose report (<out>/report/) gains "Tuned vs default" per
strategy: a verdict (Welch, flags) with 95% intervals (suite/report/tune_section.py; also in
<out>/TUNING.md, which lists every trial with its fate and why); <out>/tune.json holds every
trial and <out>/tuned-<strategy>.yaml the tuned matrix.
"""
from __future__ import annotations

import json
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from shardbench.trainer.config import RunConfig
from shardbench.suite.report import tune_section as tune_report
from shardbench.suite.matrix.planning import peak_bytes_per_rank
from shardbench.suite.analyze.stats import Estimate, estimate

APPLIES: dict[str, Any] = {
    "fsdp_grad_sync": lambda s: s.engine == "fsdp",
    "reshard_after_forward": lambda s: "params" in s.sharded,
    "bucket_mib": lambda s: s.engine in BUCKETED_ENGINES,  # type: ignore[has-type]
    "offload": lambda s: s.engine != "ddp",
    "zero_hpz_partition_size": lambda s: s.zero_stage == 3,
}
"""Which layouts a layout-specific knob acts on, from the contract's strategy attributes (never
a strategy's name): the FSDP2 engine's gradient sync; re-sharding after forward where parameters
are sharded (FSDP2, ZeRO-3); bucket sizes where the engine communicates in buckets (DDP's reducer,
DeepSpeed). A knob searched where it does nothing doubles the space and "tunes" noise (issue 32:
ddp searched reshard_after_forward and recommended false). Knobs not listed act on every layout;
offload outside ddp (its values filtered by the rules' placements) and hpZ at ZeRO-3 (ON_REQUEST)."""
ON_REQUEST = ("offload", "zero_hpz_partition_size")
"""Layout knobs of APPLIES searched only when --space gives them: where state lives and ZeRO++
change what a trial measures (device memory traded for host memory and copies; a secondary
partition), not just how fast, so the default search keeps the declared layout."""
BUCKETED_ENGINES = ("ddp", "deepspeed")
"""Engines that communicate gradients in buckets (FSDP2 communicates per module)."""
MIN_PRUNE_STEPS = 3
"""Measured steps a trial runs before the pruner may stop it: one noisy sample is no verdict
(issue 32: a pruned trial's 699.8 tok/s beat the chosen best's 584)."""


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple


def applies(name: str, strategy: str) -> bool:
    """Whether knob `name` changes anything for `strategy` (contract attributes, APPLIES)."""
    from shardbench.trainer.contract import STRATEGIES

    rule = APPLIES.get(name)
    return rule is None or (strategy in STRATEGIES and bool(rule(STRATEGIES[strategy])))


def search_space(strategy: str, per_rank_batch: int, given: dict[str, list] | None = None) -> list[Knob]:
    """The knobs searched for `strategy`: micro-batch (divisors of the per-rank batch),
    activation checkpointing and every layout knob of APPLIES that acts on this layout; `given`
    (from --space KEY=[...]) replaces a knob's values or adds one, still only where it applies."""
    space = [Knob("micro_batch", tuple(d for d in (1, 2, 4, 8, 16, 32, 64) if per_rank_batch % d == 0)),
             Knob("activation_checkpointing", (False, True))]
    hints = typing.get_type_hints(RunConfig)
    by_field = {f.name: f for f in fields(RunConfig)}
    for name in APPLIES:
        if name in by_field and name not in ON_REQUEST:
            values = _values_of(hints[name], by_field[name].default, by_field[name].metadata)
            if values:
                space.append(Knob(name, values))
    by_name = {k.name: k for k in space}
    if "grad_accum" in (given or {}):
        del by_name["micro_batch"]  # the batch axis searched by its grad-accum: micro-batch follows
    for name, values in (given or {}).items():  # type: ignore[assignment]
        if name == "offload":  # only the placements this layout can make (trainer/rules.py state_error)
            values = tuple(v for v in values if _places(strategy, v))
            if not values:
                continue
        by_name[name] = Knob(name, tuple(values))
    return [k for k in by_name.values() if applies(k.name, strategy)]


def _places(strategy: str, offload: Any) -> bool:
    from shardbench.trainer import contract, rules

    if offload not in contract.OFFLOADS or strategy not in contract.STRATEGIES:
        return True  # the rules say what is wrong with it, one line
    return rules.state_error(contract.state_layout(strategy, offload), strategy) is None


def batch_axis_errors(per_rank_batch: int, given: dict[str, list]) -> list[str]:
    """Why --space's micro-batch / grad-accum values cannot be searched at this per-rank batch."""
    if "micro_batch" in given and "grad_accum" in given:
        return ["--space: give micro_batch or grad_accum, not both: at the fixed global batch one follows "
                "from the other"]
    for name in ("micro_batch", "grad_accum"):
        bad = [v for v in given.get(name, ()) if not isinstance(v, int) or isinstance(v, bool) or v < 1
               or per_rank_batch % v]
        if bad:
            return [f"--space {name}: {bad} do not divide the per-rank batch {per_rank_batch} (global batch / "
                    "world size) into whole micro-batches"]
    return []


def _values_of(kind, default, meta) -> tuple:
    """Candidate values of a field from its type: both for a bool, every choice for a Literal,
    default / 4, default, default x 4 for a number."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if len(args) == 1 else kind
    if typing.get_origin(kind) is typing.Literal:
        return tuple(typing.get_args(kind))
    if base is bool:
        return (False, True)
    if base in (int, float) and isinstance(default, (int, float)) and default > 0:
        low = meta.get("min") or 0
        return tuple(dict.fromkeys(base(max(low, v)) for v in (default / 4, default, default * 4)))
    return ()


# --- one study ----------------------------------------------------------------------------

@dataclass
class Tuning:
    """What tune found for one strategy."""

    strategy: str
    default: dict[str, Any]
    best: dict[str, Any] | None = None
    trials: list[dict[str, Any]] | None = None
    default_est: Estimate | None = None
    tuned_est: Estimate | None = None
    ids: dict[str, Any] | None = None
    """What tune_report's "Tuned vs default" reads: config id and params of default and tuned."""
    default_over: str | None = None
    """Why the default configuration was not run: the planner predicts it over the limit."""


class Tuner:
    def __init__(self, base, backend, out: Path, limit_bytes: int | None, trials: int, repeats: int,
                 space: dict[str, list] | None = None, seed: int = 0, emit=None):
        from shardbench.suite.matrix.expand import expand

        self.base, self.backend, self.out, self.limit = base, backend, Path(out), limit_bytes
        self.n_trials, self.repeats, self.given, self.seed = trials, repeats, space or {}, seed
        self.emit = emit or (lambda _e: None)
        self.planner, self.planner_name = peak_bytes_per_rank, "suite/matrix/planning.py peak_bytes_per_rank"
        self._expand = expand

    def spec_for(self, strategy: str, params: dict[str, Any], repeats: int = 1):
        """The run specs of `strategy` with `params` (micro-batch and knobs) at the base's global batch."""
        from shardbench.suite.matrix.expand import matrix_from_dict

        world = self.base.world_sizes[0]
        global_batch = self.base.global_batch or self.base.micro_batch * (self.base.grad_accum or 1) * world
        params = _batch_params(params, self._per_rank_batch())
        data = {k: v for k, v in _matrix_dict(self.base).items() if k not in params}
        data.update(params, strategies=[strategy], world_sizes=[world], global_batch=global_batch,
                    grad_accum=None, repeats=repeats)
        specs, errors = self._expand(matrix_from_dict(data))
        if errors:
            raise ValueError("; ".join(errors))
        return specs

    def default_params(self, strategy: str) -> dict[str, Any]:
        defaults = {f.name: f.default for f in fields(RunConfig)}
        out = {}
        for knob in search_space(strategy, self._per_rank_batch(), self.given):
            if knob.name == "micro_batch":
                out["micro_batch"] = self.base.micro_batch if self.base.micro_batch in knob.values else knob.values[0]
            elif knob.name == "grad_accum":
                ga = self._per_rank_batch() // self.base.micro_batch
                out["grad_accum"] = ga if ga in knob.values else knob.values[0]
            else:
                value = self.base.overrides.get(knob.name, defaults.get(knob.name))
                out[knob.name] = value if value in knob.values else knob.values[0]
        return out

    def _per_rank_batch(self) -> int:
        world = self.base.world_sizes[0]
        if self.base.global_batch:
            return self.base.global_batch // world
        return self.base.micro_batch * (self.base.grad_accum or 1)

    def study(self, strategy: str) -> Tuning:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        space = search_space(strategy, self._per_rank_batch(), self.given)
        default = self.default_params(strategy)
        grid = {k.name: list(k.values) for k in space}
        points = 1
        for values in grid.values():
            points *= len(values)
        # A space no larger than the trials is walked whole (each point once); a larger one is
        # sampled by TPE after the default, which is always measured: it is the baseline.
        small = points <= self.n_trials
        sampler = (optuna.samplers.GridSampler(grid, seed=self.seed) if small
                   else optuna.samplers.TPESampler(seed=self.seed))
        study = optuna.create_study(direction="maximize", study_name=strategy, sampler=sampler,
                                    pruner=optuna.pruners.MedianPruner(
                                        n_startup_trials=1, n_warmup_steps=self.base.warmup_steps + MIN_PRUNE_STEPS))
        if not small:
            study.enqueue_trial(default)
        study.optimize(lambda t: self._objective(t, strategy, space), n_trials=min(points, self.n_trials),
                       catch=(ValueError,))
        trials = [{"number": t.number, "state": t.state.name, "params": t.params, "value": t.value,
                   **t.user_attrs} for t in study.trials]
        feasible = [t for t in study.trials if t.value and t.user_attrs.get("feasible")]
        best = max(feasible, key=lambda t: t.value).params if feasible else None  # type: ignore[arg-type,return-value]
        return Tuning(strategy, default, best, trials)

    def _objective(self, trial, strategy: str, space: list[Knob]) -> float:
        import optuna

        params = {k.name: trial.suggest_categorical(k.name, list(k.values)) for k in space}
        spec = self.spec_for(strategy, params)[0]
        trial.set_user_attr("micro_batch", spec.micro_batch)  # both, whichever of the two was searched
        trial.set_user_attr("grad_accum", spec.grad_accum)
        predicted = int(self.planner(spec.run_config(), spec.world_size))
        trial.set_user_attr("predicted_peak_bytes", predicted)
        trial.set_user_attr("run_id", spec.run_id)
        over_limit = self.over_limit(predicted)
        if over_limit:
            trial.set_user_attr("feasible", False)
            trial.set_user_attr("rejected", over_limit)
            trial.set_user_attr("fate", "rejected before launch")
            trial.set_constraint("memory", predicted - self.limit)  # type: ignore[operator]
            return 0.0
        record, pruned = self._run_trial(trial, spec)
        trial.set_user_attr("status", record.get("status"))
        if pruned:
            trial.set_user_attr("fate", "pruned")
            trial.set_user_attr("reason", f"below the median of earlier trials at measured step {pruned[0]} "
                                          f"({pruned[1]:,.1f} tok/s)")
            raise optuna.TrialPruned()
        # The quantity the planner predicted: the live-tensor peak (a GPU's allocator peak or CPU
        # model state is another number: comparing those let a 38.6 MiB model state "pass" an 86 MiB peak).
        measured = record.get("tensor_peak_bytes")
        measured = measured if isinstance(measured, int) else record.get("peak_memory_bytes")
        trial.set_user_attr("measured_peak_bytes", measured)
        over = max(measured or 0, 0) - self.limit if self.limit is not None else -1
        ok = record.get("status") == "ok" and isinstance(record.get("tokens_per_s"), (int, float))
        trial.set_constraint("memory", over if record.get("status") != "oom" else max(over, 1))
        trial.set_user_attr("feasible", ok and over <= 0)
        trial.set_user_attr("fate", "measured" if ok and over <= 0 else "over the limit when measured" if ok
                            else f"run {record.get('status')}")
        if not ok:
            trial.set_user_attr("reason", str(record.get("error") or "")[:200])
        elif over > 0:
            trial.set_user_attr("reason", f"measured tensor peak {measured / 2**20:.1f} MiB > limit "  # type: ignore[operator]
                                          f"{self.limit / 2**20:.1f} MiB")  # type: ignore[operator]
        return float(record["tokens_per_s"]) if ok else 0.0

    def over_limit(self, predicted: int) -> str | None:
        """Why a configuration is not launched (predicted over the limit), or None."""
        if self.limit is None or predicted <= self.limit:
            return None
        return f"predicted {predicted / 2**20:.1f} MiB > limit {self.limit / 2**20:.1f} MiB"

    def _run_trial(self, trial, spec) -> tuple[dict, list]:
        """The trial's record and, when pruned, [measured step, its tok/s]."""
        from shardbench.suite.execute.events import RunProgress
        from shardbench.suite.execute.runner import Runner

        pruned: list[float] = []

        def watch(event):
            self.emit(event)
            if (isinstance(event, RunProgress) and event.phase == "measure" and event.tokens_per_s
                    and not pruned):
                trial.report(event.tokens_per_s, event.step)
                if trial.should_prune():  # never before MIN_PRUNE_STEPS measured steps (the pruner's warm-up)
                    pruned.extend((event.step - self.base.warmup_steps, event.tokens_per_s))
                    runner.cancel(spec.run_id)

        runner = Runner([spec], self.backend, self.out / "trials", watch, order_seed=self.seed)
        record = runner.run()[0]
        return record, pruned

    def remeasure(self, tuning: Tuning) -> None:
        """Run the default and the best configuration `repeats` times each, interleaved."""
        from shardbench.suite.execute.runner import Runner

        default = self.spec_for(tuning.strategy, tuning.default, self.repeats)
        best = self.spec_for(tuning.strategy, tuning.best, self.repeats) if tuning.best else []
        same = best and best[0].config_id == default[0].config_id
        # Never launched when predicted over the limit, the default included: it is reported as
        # breaking the limit, not measured and compared as if it were a valid baseline.
        tuning.default_over = self.over_limit(int(self.planner(default[0].run_config(), default[0].world_size)))
        tuning.ids = {"default": {"config_id": default[0].config_id, "params": tuning.default,
                                  "over_limit": tuning.default_over},
                      "tuned": {"config_id": best[0].config_id, "params": tuning.best} if best else None}
        specs = ([] if tuning.default_over else default) + ([] if same else best)
        if not specs:
            return
        records = Runner(specs, self.backend, self.out / "remeasure", self.emit, order_seed=self.seed).run()
        tps: dict[str, list[float]] = {}
        for r in records:
            if r.get("status") == "ok":
                tps.setdefault(r["run_id"].rsplit("-r", 1)[0], []).append(r["tokens_per_s"])
        key = default[0].run_id.rsplit("-r", 1)[0]
        tuning.default_est = estimate(tps.get(key, []))
        tuning.tuned_est = tuning.default_est if same or not best else estimate(
            tps.get(best[0].run_id.rsplit("-r", 1)[0], []))


def _batch_params(params: dict[str, Any], per_rank_batch: int) -> dict[str, Any]:
    """Params with a searched grad-accum turned into the micro-batch it leaves at this per-rank
    batch (the matrix derives grad-accum back from the global batch)."""
    if "grad_accum" not in params:
        return params
    out = {k: v for k, v in params.items() if k != "grad_accum"}
    out["micro_batch"] = per_rank_batch // int(params["grad_accum"])
    return out


def _matrix_dict(m) -> dict[str, Any]:
    from dataclasses import asdict

    data = asdict(m)
    data.update(data.pop("overrides"))
    return data


# --- outputs ------------------------------------------------------------------------------

def write_outputs(tuner: Tuner, results: list[Tuning]) -> Path:
    """tuning.json in the re-measured result set (so its report gains "Tuned vs default"), that
    report under <out>/report/, TUNING.md (the same section, with the study's settings),
    tune.json (every trial) and tuned-<strategy>.yaml (the tuned matrix)."""
    from shardbench.suite.analyze.rows import load_records
    from shardbench.suite.report.markdown import build_report

    out = tuner.out
    out.mkdir(parents=True, exist_ok=True)
    tuning = {t.strategy: t.ids for t in results if t.ids}
    (out / "remeasure").mkdir(parents=True, exist_ok=True)  # empty when nothing could be re-measured
    (out / "remeasure" / tune_report.TUNING_FILE).write_text(json.dumps(tuning, indent=2, default=str))
    intro = (f"# Tuning\n\nPer strategy, up to {tuner.n_trials} trials (Optuna: TPE, or a grid when the space "
             f"is that small; MedianPruner) at world size {tuner.base.world_sizes[0]} and the base matrix's "
             "global batch; memory limit " + (f"{tuner.limit / 2**30:.3f} GiB per rank" if tuner.limit else "none")
             + f"; planner: {tuner.planner_name}; {tuner.repeats} re-measured repeats each. Every trial: "
             "[tune.json](tune.json); the full report of the re-measured runs: "
             "[report/](report/BENCHMARK_REPORT.md).\n\n")
    section = tune_report.tuned_section(load_records(out / "remeasure"), tuning)
    trials = "\n\n".join(tune_report.trials_section(t.strategy, t.trials or [], t.best) for t in results)
    (out / "TUNING.md").write_text(intro + section + "\n\n" + trials + "\n")
    try:
        build_report(out / "remeasure", out / "report")
    except (OSError, ValueError) as exc:
        (out / "TUNING.md").open("a").write(f"\nreport not written: {exc}\n")
    for t in results:
        if t.best:
            _write_tuned_matrix(tuner, t)
    (out / "tune.json").write_text(json.dumps([{"strategy": t.strategy, "default": t.default, "best": t.best,
                                               "trials": t.trials} for t in results], indent=2, default=str))
    return out / "TUNING.md"


def _write_tuned_matrix(tuner: Tuner, t: Tuning) -> None:
    base = tuner.base
    best = _batch_params(t.best, tuner._per_rank_batch())  # type: ignore[arg-type]
    tuned = replace(base, strategies=[t.strategy], micro_batch=best.get("micro_batch", base.micro_batch),
                    overrides={**base.overrides, **{k: v for k, v in best.items() if k != "micro_batch"}})
    data = _matrix_dict(tuned)
    data.update(results=f"results/tuned-{t.strategy}", grad_accum=None,
                global_batch=base.global_batch or base.micro_batch * (base.grad_accum or 1) * base.world_sizes[0])
    (tuner.out / f"tuned-{t.strategy}.yaml").write_text(
        f"# shardbench tune: the best of {tuner.n_trials} trials for {t.strategy}\n"
        + yaml.safe_dump(data, sort_keys=False))
