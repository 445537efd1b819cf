"""Settings compared as axes (suite/analyze/axes.py) and the loss check's drifts for settings that
change the trajectory by design (suite/analyze/losscheck.py `drifts`), on made-up records; the real
runs behind them are tests/trainer/test_float8_compile_hooks.py."""
from __future__ import annotations

from shardbench.suite.analyze import analysis, losscheck
from tests.synthetic import record

LOSS = [9.0, 8.9, 8.8, 8.7, 8.6, 8.5]


def _run(config: str, repeat: int, tps: float, loss: list[float] = LOSS, world: int = 1, **settings) -> dict:
    rec = record(world_size=world, tokens_per_s=tps, repeat=repeat, settings=settings, loss_per_step=loss,
                 config_id=config, run_id=f"ddp-w{world}-{config}-r{repeat}", **settings)
    return rec


def test_each_swept_setting_is_compared_with_its_default_with_an_interval():
    """float8 x compile, three repeats each: every float8 value against off and compile on against
    off, inside groups equal except that setting, as a tokens/s ratio with its 95% interval."""
    tps = {("off", False): 1000.0, ("tensorwise", False): 50.0, ("off", True): 1200.0, ("tensorwise", True): 55.0}
    records = [_run(f"{f8[:3]}{int(c)}", r, t * (1 + 0.01 * r), float8=f8, compile=c)
               for (f8, c), t in tps.items() for r in range(3)]
    an = analysis.analyze(records)
    by = {(a.setting, str(a.value), a.context): a for a in an.axes}
    assert set(by) == {("float8", "tensorwise", "compile off"), ("float8", "tensorwise", "compile on"),
                       ("compile", "True", "float8 off"), ("compile", "True", "float8 tensorwise")}
    f8 = by[("float8", "tensorwise", "compile off")]
    assert f8.baseline == "off" and f8.ratio is not None and f8.ratio.has_interval
    assert f8.ratio.lo < 0.05 < f8.ratio.hi and abs(f8.ratio.mean - 0.05) < 1e-9
    assert by[("compile", "True", "float8 off")].ratio.mean == 1.2


def test_a_trajectory_changing_setting_is_a_measured_drift_never_a_broken_run():
    """PowerSGD against the exact hook and float8 against bf16 fall in loss groups of their own;
    the loss check reports each value's difference from the default's runs; float8 is judged
    against its measured tolerance (BEYOND here: a drift of 3e-3), PowerSGD's is only measured."""
    drifted = [x * (1 + 1e-3 * max(0, k - 2)) for k, x in enumerate(LOSS)]  # from step 3, growing
    records = [_run("none", r, 1000, world=2, ddp_comm_hook="none") for r in range(2)]
    records += [_run("psgd", r, 1100, drifted, world=2, ddp_comm_hook="powersgd", powersgd_rank=1) for r in range(2)]
    records += [_run("f8", r, 900, drifted, world=2, float8="rowwise") for r in range(2)]
    an = analysis.analyze(records)
    assert not any(g.broken for g in an.loss_groups)
    assert set(an.runs["loss_check"]) == {"ok"}
    drifts = {(d.setting, d.value): d for d in an.drifts}
    assert set(drifts) == {("ddp_comm_hook", "powersgd"), ("float8", "rowwise")}
    psgd, f8 = drifts[("ddp_comm_hook", "powersgd")], drifts[("float8", "rowwise")]
    assert abs(psgd.max_rel - 3e-3) < 1e-9 and psgd.step == 5 and psgd.tolerance is None and psgd.within is None
    assert f8.tolerance == losscheck.FLOAT8_LOSS_TOLERANCE and f8.within is False
    assert (psgd.baseline, f8.baseline, psgd.runs, psgd.baseline_runs) == ("none", "off", 2, 2)


def test_the_precision_matrix_sweeps_float8_and_compile_on_one_rank_with_repeats():
    """suite/matrices/precision-1dev.yaml: bf16 vs float8 tensorwise/rowwise x compile on/off,
    ddp on one rank, 3 repeats, a warm-up step for compile (its report's axes: the test above)."""
    from pathlib import Path

    from shardbench.suite.matrix.expand import expand, load_matrix

    m = load_matrix(Path(__file__).resolve().parents[2] / "suite" / "matrices" / "precision-1dev.yaml")
    specs, errors = expand(m)
    assert errors == []
    got = sorted((s.config.float8, s.config.compile) for s in specs if s.repeat == 0)
    assert got == sorted((f8, c) for f8 in ("off", "tensorwise", "rowwise") for c in (False, True))
    assert {s.world_size for s in specs} == {1} and {s.config.precision for s in specs} == {"bf16"}
    assert len(specs) == 6 * 3 and all(s.config.warmup_steps >= 1 for s in specs)
