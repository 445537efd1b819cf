"""Scaling efficiency only where two world sizes were measured (issue 31, finding 4)."""
from __future__ import annotations

import pandas as pd

from shardbench.suite.analyze import analysis
from shardbench.suite.report import plots
from shardbench.suite.report import markdown as report
from tests.synthetic import record


def test_one_world_size_has_no_efficiency_and_no_plot_point(tmp_path):
    """Three ok repeats at one world size read "scaling eff 1.00 (n=3)" and were plotted at 1.0."""
    recs = [record("ddp", 2, 1000.0 + 10 * k, repeat=k) for k in range(3)]
    an = analysis.analyze(recs)
    (c,) = an.configs
    assert c.efficiency is None
    assert c.efficiency_note == "only 2 dev measured: scaling needs ok runs at two world sizes"
    assert an.runs["scaling_efficiency"].isna().all()
    assert "1.00" not in report.summary_section(an)
    assert plots.series(an, "scaling_efficiency") == {}  # nothing to plot, no point at 1.0


def test_a_second_world_size_brings_the_efficiency_back():
    recs = [record("ddp", 1, 1000.0), record("ddp", 2, 1800.0)]
    an = analysis.analyze(recs)
    two = next(c for c in an.configs if c.world_size == 2)
    assert two.efficiency.mean == 0.9
    one = next(c for c in an.configs if c.world_size == 1)
    assert one.efficiency.mean == 1.0 and one.efficiency_note.startswith("base")


def test_a_failed_second_world_size_does_not_count_as_measured():
    recs = [record("ddp", 1, 1000.0), record("ddp", 2, 1.0, status="failed")]
    an = analysis.analyze(recs)
    assert all(c.efficiency is None for c in an.configs)
    assert pd.isna(an.runs["scaling_efficiency"]).all()
