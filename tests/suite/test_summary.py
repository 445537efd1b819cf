"""The Summary states the answer exactly (issue 32): "equal" only for equal counted values or
timed values whose intervals the test does not separate, the rest by their difference from the
best ("ddp = fsdp; zero1/2 +25%, zero3 +90%"), in BENCHMARK_REPORT.md, report.html and the terminal."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardbench.suite.analyze import analysis
from shardbench.suite.report import summary
from shardbench.suite.report.markdown import build_report
from tests.synthetic import record

MIB = 2 ** 20


def runs(strategy: str, world: int, values: list[float], **kw) -> list[dict]:
    return [record(strategy, world, v, repeat=i, **kw) for i, v in enumerate(values)]


def one_device() -> list[dict]:
    """Memory at one device as measured: ddp = fsdp, zero1/2 25% more, zero3 90% more; ddp and fsdp
    not separated in throughput, zero3 clearly slower."""
    state = {"ddp": 40, "fsdp": 40, "zero1": 50, "zero2": 50, "zero3": 76}
    tps = {"ddp": [1000.0, 1010.0, 990.0], "fsdp": [1004.0, 996.0, 1012.0], "zero1": [700.0, 702.0, 698.0],
           "zero2": [700.0, 701.0, 699.0], "zero3": [500.0, 501.0, 499.0]}
    return [r for s in state for r in runs(s, 1, tps[s], model_state_bytes_per_rank=state[s] * MIB)]


def write(tmp_path: Path, records: list[dict]) -> Path:
    results = tmp_path / "results"
    for r in records:
        (results / r["run_id"]).mkdir(parents=True)
        (results / r["run_id"] / "result.json").write_text(json.dumps(r))
    return results


def test_memory_ties_are_stated_exactly_not_as_all_equal():
    an = analysis.analyze(one_device())
    (row,) = summary.rows(an.verdicts)
    assert row[3] == "ddp = fsdp; zero1/2 +25%, zero3 +90%", row[3]
    mem = next(v for v in an.verdicts if v.category.name.startswith("memory"))
    assert mem.kind == "equal" and [c.strategy for c in mem.tied] == ["ddp", "fsdp"]
    assert "equal: ddp = fsdp at" in mem.text and "zero3" in mem.text and "+90%" in mem.text


def test_timed_tie_names_only_the_candidates_not_separated():
    an = analysis.analyze(one_device())
    (row,) = summary.rows(an.verdicts)
    top = row[1]
    assert top.split(" (not separated)")[0] in ("ddp ≈ fsdp", "fsdp ≈ ddp"), top
    assert "zero1/2 -30%" in top and "zero3 -50%" in top, top


def test_a_true_winner_and_an_all_equal_group():
    recs = (runs("ddp", 2, [1000.0, 1010.0, 990.0], model_state_bytes_per_rank=40 * MIB)
            + runs("zero3", 2, [800.0, 805.0, 795.0], model_state_bytes_per_rank=40 * MIB))
    (row,) = summary.rows(analysis.analyze(recs).verdicts)
    assert row[1] == "**ddp**; zero3 -20%" and row[3] == "ddp = zero3"
    assert summary.merge_names(["zero1", "zero2", "zero3"]) == "zero1/2/3"


def test_report_and_html_state_the_same_tie(tmp_path):
    rep = build_report(write(tmp_path, one_device()), tmp_path / "out")
    md = rep.markdown.read_text()
    assert "ddp = fsdp; zero1/2 +25%, zero3 +90%" in md.split("## Summary\n", 1)[1].split("\n## ", 1)[0]
    assert "equal: ddp, fsdp, zero1" not in md
    page = rep.html.read_text()
    assert "ddp = fsdp; zero1/2 +25%, zero3 +90%" in page


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a report with plots, in a fresh interpreter: ~4 s idle
def test_report_cli_ends_by_printing_the_summary(tmp_path):
    import subprocess
    import sys

    results = write(tmp_path, one_device())
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "report", str(results), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    tail = proc.stdout.split("Summary (", 1)[1]
    assert "least memory: ddp = fsdp; zero1/2 +25%, zero3 +90%" in tail
    assert "fastest:" in tail and "tok/s" in tail and "BENCHMARK_REPORT.md" in tail


def test_run_cli_ends_by_printing_the_summary(tmp_path):
    """Every run already finished (resumed): `shardbench run` still ends with the answer."""
    import subprocess
    import sys

    from shardbench.suite.cli.commands import build_parser
    from shardbench.suite.cli.matrix_flags import effective_matrix
    from shardbench.suite.matrix.expand import expand
    from tests.suite.test_runner import finish, ok_record_for

    args = ["--strategies", "ddp,zero3", "--world-sizes", "1", "--repeats", "2", "--device", "cpu",
            "--precision", "fp32"]
    specs, errors = expand(effective_matrix(build_parser().parse_args(["run", "--results", str(tmp_path), *args])))
    assert not errors and len(specs) == 4
    for s in specs:
        rec = ok_record_for(s)
        tps = (1000.0 if s.strategy == "ddp" else 500.0) + 5 * s.repeat
        rec.update(tokens_per_s=tps, tokens_per_s_per_device=tps,
                   model_state_bytes_per_rank=(40 if s.strategy == "ddp" else 76) * MIB)
        finish(tmp_path, s, rec)
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(tmp_path), *args,
                           "--quiet", "--no-plan"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tail = proc.stdout.split("Summary (", 1)[1]
    assert "least memory: ddp; zero3 +90%" in tail, tail
    assert "fastest:      ddp; zero3 -50%" in tail, tail


def test_group_labels_show_readable_values():
    from shardbench.suite.analyze import groups

    an = analysis.analyze(one_device())
    c = an.configs[0]
    label = analysis.group_label(c, {"bucket_mib": 25.0, "fsdp_grad_sync": None, "reshard_after_forward": False},
                                 ["bucket_mib", "fsdp_grad_sync", "reshard_after_forward"])
    assert label.endswith("bucket-mib 25, reshard-after-forward off"), label
    assert "None" not in label and groups.shown("fsdp_grad_sync", None) is None


def swept() -> list[dict]:
    """ddp and zero3 at 1 and 2 devices, bucket size swept (10 and 25 MiB): eight configurations."""
    out = []
    for strategy in ("ddp", "zero3"):
        for world in (1, 2):
            for bucket in (10.0, 25.0):
                for r in runs(strategy, world, [1000.0 * world, 1010.0 * world, 990.0 * world], bucket_mib=bucket):
                    r["config_id"] = f"{r['config_id'][:6]}{int(bucket):02d}"
                    r["run_id"] = f"{strategy}-w{world}-b{int(bucket)}-{r['config_id']}-r{r['repeat']}"
                    out.append(r)
    return out


def test_a_sweep_keeps_every_configuration_in_scaling_summary_csv_and_loss_labels(tmp_path):
    """Issue 27 item 5: the scaling table keyed rows by strategy only (a sweep dropped
    configurations); summary.csv and the loss-check labels left out the swept knob (identical lines)."""
    import pandas as pd

    rep = build_report(write(tmp_path, swept()), tmp_path / "out")
    md = rep.markdown.read_text()
    scaling = md.split("## Scaling efficiency\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in scaling.splitlines() if line.startswith("| ddp") or line.startswith("| zero3")]
    assert len(rows) == 4 and "bucket-mib" in scaling, scaling
    assert {r.split("|")[2].strip() for r in rows} == {"bucket-mib 10", "bucket-mib 25"}
    csv = pd.read_csv(rep.summary_csv)
    assert len(csv) == 8 and "bucket_mib" in csv.columns
    assert not csv.drop(columns=[c for c in csv.columns if c.startswith("config_id")]).duplicated().any()
    loss = [line for line in md.split("## Loss check\n", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("- ")]
    assert len(loss) == len(set(loss)) >= 2, loss


def noisy() -> list[dict]:
    """Means of 230-1,416 tok/s, one configuration's repeats so spread its interval reaches 25k."""
    return (runs("ddp", 1, [1400.0, 1416.0, 1430.0]) + runs("zero3", 1, [230.0, 232.0, 229.0])
            + runs("fsdp", 1, [60.0, 900.0, 200.0]))


def test_plots_use_a_log_axis_clip_wide_intervals_and_mark_flagged_points(tmp_path):
    import matplotlib.pyplot as plt

    from shardbench.suite.report import plots

    an = analysis.analyze(noisy())
    fsdp = next(c for c in an.configs if c.strategy == "fsdp")
    assert fsdp.flags and fsdp.est["tokens_per_s"].hi > 5000  # the interval that swamped the page
    captured = {}
    real_save = plots._save
    plots._save = lambda fig, path: captured.update(ax=fig.axes[0]) or real_save(fig, path)
    try:
        assert plots.draw(an, plots.PLOTS[0], tmp_path / "t.png")
    finally:
        plots._save = real_save
    ax = captured["ax"]
    low, high = ax.get_ylim()
    assert ax.get_yscale() == "log"
    means = [c.est["tokens_per_s"].mean for c in an.configs]
    assert high <= max(means) * plots.CLIP * 1.001 and low >= min(means) / plots.CLIP * 0.999
    labels = ax.get_legend_handles_labels()[1]
    assert "flagged (see Flags)" in labels
    assert any("cut" in t.get_text() for t in ax.texts)
    plt.close("all")


def test_summary_cells_show_a_very_wide_interval_as_its_spread():
    an = analysis.analyze(noisy())
    (row,) = summary.rows(an.verdicts)
    assert "wide: n=3, spread x" in row[2] and "[" not in row[2].split("fsdp")[1].split(";")[0], row[2]


def _configs(strategy: str, worlds: tuple[int, ...], variants: list[dict]) -> list[dict]:
    """Three repeats of each variant (record() keywords; `settings` for a knob) at each world size,
    each its own configuration id."""
    out = []
    for world in worlds:
        for n, kw in enumerate(variants):
            for r in runs(strategy, world, [1000.0 * world, 1010.0 * world, 990.0 * world], **kw):
                r["config_id"] = f"{strategy[:3]}{world}{n:03d}"
                r["run_id"] = f"{strategy}-w{world}-v{n}-{r['config_id']}-r{r['repeat']}"
                out.append(r)
    return out


@pytest.mark.parametrize("case", ["grad_accum", "global_batch", "dp_replicate"])
def test_every_configuration_of_a_sweep_has_its_own_scaling_cell_and_summary_row(tmp_path, case):
    """Issue 27 item 5, the sweeps the bucket sweep did not cover: a grad-accum or global-batch
    sweep kept one of each world size's two configurations in the scaling table (both on the line
    'ddp'); fsdp at dp_replicate 1 and 2 were two summary.csv rows equal but their config ids."""
    variants = {"grad_accum": [{"grad_accum": 1}, {"grad_accum": 2}],
                "global_batch": [{"grad_accum": 2, "settings": {"global_batch": 8}},
                                 {"grad_accum": 4, "settings": {"global_batch": 16}}],
                "dp_replicate": [{"settings": {"dp_replicate": 1}}, {"settings": {"dp_replicate": 2}}]}[case]
    recs = _configs("fsdp" if case == "dp_replicate" else "ddp", (2, 4), variants)
    if case == "global_batch":  # at 4 devices the same global batches take half the micro-steps
        recs = [r for r in recs if r["world_size"] == 2] + [
            r for r in _configs("ddp", (4,), [{"grad_accum": 1, "settings": {"global_batch": 8}},
                                              {"grad_accum": 2, "settings": {"global_batch": 16}}])]
    rep = build_report(write(tmp_path, recs), tmp_path / "out")
    md = rep.markdown.read_text()
    scaling = md.split("## Scaling efficiency\n", 1)[1].split("\n## ", 1)[0]
    cells = [cell.strip() for line in scaling.splitlines() if line.startswith("| ddp") or line.startswith("| fsdp")
             for cell in line.split("|")[-3:-1]]
    assert sum(cell != "-" for cell in cells) == 4, scaling  # 2 configurations x 2 world sizes
    import pandas as pd

    csv = pd.read_csv(rep.summary_csv)
    assert len(csv) == 4 and not csv.drop(columns=["config_id"]).duplicated().any(), csv.to_string()
    from shardbench.suite.report import plots

    lines = plots.series(analysis.analyze(recs), "tokens_per_s")  # a plotted line: one point per world size
    assert sum(len(points) for points in lines.values()) == 4, lines
    assert all(len({p[0] for p in points}) == len(points) for points in lines.values()), lines


def test_powersgd_loss_groups_at_two_world_sizes_have_two_labels():
    """PowerSGD's loss groups are per world size (its error depends on the ranks): their two lines
    read the same without the ranks."""
    recs = [record("ddp", world, 1000.0, repeat=r, settings={"ddp_comm_hook": "powersgd"}, ddp_comm_hook="powersgd",
                   config_id=f"psgd{world}", run_id=f"ddp-w{world}-psgd{world}-r{r}")
            for world in (1, 2) for r in range(2)]
    labels = [g.label for g in analysis.analyze(recs).loss_groups]
    assert len(labels) == 2 and len(set(labels)) == 2, labels
    assert labels[0].endswith(" ranks") and labels[1].endswith(" ranks"), labels
