"""report.html (suite/report/html_page.py) opened in a real headless Chromium: it loads with no
console error and no request beyond the file itself, every plot renders, the tables sort, a
screenshot is made. Plus the loss-curve and per-rank plots every report now has."""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardbench.trainer.record import write_atomic
from shardbench.suite.report.markdown import build_report
from tests.synthetic import record

from .browser import Browser

ROOT = Path(__file__).resolve().parents[2]


def result_set(directory: Path) -> Path:
    """Two strategies at 1 and 2 ranks, 3 repeats, a flagged configuration (spread), a failed run;
    per-rank model state and RSS as the trainer records them."""
    for strategy, world, values in [("ddp", 1, [100, 102, 98]), ("ddp", 2, [190, 195, 185]),
                                    ("zero3", 1, [90, 91, 89]), ("zero3", 2, [100, 200, 170])]:
        for rep, tps in enumerate(values):
            state = [{"rank": r, "total_bytes": (4 if strategy == "ddp" else 4 // world) * 2 ** 20 + r * 2 ** 18}
                     for r in range(world)]
            rec = record(strategy, world, float(tps), repeat=rep, model_state=state,
                         loss_per_step=[9.0, 8.7 - 0.01 * world, 8.5, 8.4, 8.3, 8.25])
            rec["memory"] = [{"rank": r, "rss_peak_bytes": (500 + 10 * r) * 2 ** 20} for r in range(world)]
            write_atomic(rec, str(directory / rec["run_id"] / "result.json"))
    bad = record("fsdp", 2, 1.0, status="failed", error="RuntimeError: boom <b>not markup</b>")
    write_atomic(bad, str(directory / bad["run_id"] / "result.json"))
    return directory


def test_report_draws_loss_curves_and_per_rank_plots(tmp_path):
    rep = build_report(result_set(tmp_path / "results"), tmp_path / "report")
    names = {p.name for p in rep.plots}
    assert {"loss_curves.png", "per_rank_model_state.png", "per_rank_peak.png"} <= names
    assert all(p.stat().st_size > 5000 for p in rep.plots)
    md = rep.markdown.read_text()
    assert "](plots/loss_curves.png)" in md and "](plots/per_rank_model_state.png)" in md


@pytest.mark.slow  # a report with plots, in a fresh interpreter: ~6 s idle
def test_html_report_is_self_contained(tmp_path):
    rep = build_report(result_set(tmp_path / "results"), tmp_path / "report")
    page = rep.html.read_text()
    assert rep.html == tmp_path / "report" / "report.html"
    assert page.count('src="data:image/png;base64,') == len(rep.plots)
    refs = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert refs and all(r.startswith("data:") for r in refs), refs
    assert "Content-Security-Policy" in page and "&lt;b&gt;not markup&lt;/b&gt;" in page
    # shardbench report writes it too, and says where
    out = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "report", str(tmp_path / "results"),
                          "--out", str(tmp_path / "again")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "again" / "report.html").is_file() and "report.html" in out.stdout


@pytest.mark.slow
def test_html_report_in_headless_chromium(tmp_path):
    from PIL import Image

    rep = build_report(result_set(tmp_path / "results"), tmp_path / "report")
    url = rep.html.resolve().as_uri()
    with Browser(tmp_path / "profile") as browser:
        browser.open(url)
        images = browser.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
                                  "i.naturalHeight, i.getBoundingClientRect().width])")
        assert len(images) == len(rep.plots)
        assert all(done and w > 100 and h > 100 and shown > 100 for done, w, h, shown in images), images
        # Sort the configurations table by throughput: ascending, then descending on a second click.
        column = """(() => { const t = document.querySelectorAll('table.sortable')[1];
            const i = Array.from(t.tHead.rows[0].cells).findIndex(c => c.textContent.startsWith('tok/s'));
            return Array.from(t.tBodies[0].rows).map(r => Number(r.cells[i].dataset.v)); })()"""
        click = """(() => { const t = document.querySelectorAll('table.sortable')[1];
            Array.from(t.tHead.rows[0].cells).find(c => c.textContent.startsWith('tok/s')).click(); })()"""
        before = browser.evaluate(column)
        browser.evaluate(click)
        ascending = browser.evaluate(column)
        browser.evaluate(click)
        descending = browser.evaluate(column)
        assert sorted(before) == ascending and ascending[::-1] == descending and len(ascending) == 4
        shot = browser.screenshot(tmp_path / "report.png")
        assert browser.errors() == []
        assert [u for u in browser.requests() if not u.startswith(("file:", "data:"))] == []
    with Image.open(shot) as img:
        assert img.format == "PNG" and img.width >= 1000 and img.height > 2000  # the whole page
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50  # drawn, not blank


def test_html_report_carries_every_section_of_the_markdown(tmp_path):
    """Summary first, then everything BENCHMARK_REPORT.md has (setup and versions, memory
    breakdown, scaling, loss check ...): issue 32 found only verdicts, configurations and plots."""
    rep = build_report(result_set(tmp_path / "results"), tmp_path / "report")
    page = rep.html.read_text()
    md_headings = [line[3:] for line in rep.markdown.read_text().splitlines() if line.startswith("## ")]
    html_headings = re.findall(r"<h2[^>]*>([^<]*)</h2>", page)
    assert html_headings == [html.escape(h) for h in md_headings]
    assert html_headings[0] == "Summary" and "python / torch / deepspeed" in page and "2.13.0" in page
    assert "Model state per rank" in html_headings and "Loss check" in html_headings
    assert "flag</summary>" in page  # the flags folded, not 15 wrapped lines per row


def test_html_report_in_chromium_fits_1280_px_with_summary_setup_and_memory(tmp_path):
    rep = build_report(result_set(tmp_path / "results"), tmp_path / "report")
    with Browser(tmp_path / "profile") as browser:
        browser.open(rep.html.resolve().as_uri())
        width = browser.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth, "
                                 "window.innerWidth]")
        assert width[2] == 1280 and width[0] <= width[1], width
        first = browser.evaluate("document.querySelector('h2').textContent")
        assert first == "Summary"
        text = browser.evaluate("document.body.innerText")
        assert "ddp" in text.split("\nVerdicts\n")[0] and "python / torch / deepspeed" in text
        assert "Model state per rank" in text and "Loss check" in text
        assert browser.errors() == []


def test_tables_rendered_directly_are_what_markdown_it_makes():
    """html_page.render_markdown renders the report's plain pipe tables itself (markdown-it took 3 s
    on the 4,700-row plan table of 5,000 runs, issue 35): byte for byte what markdown-it makes,
    with cells holding markup, escapes, missing and extra cells, and tables it must leave to
    markdown-it (no blank line before, a backslash, a text line after, a code fence)."""
    from shardbench.suite.report.html_page import _markdown, render_markdown

    md = _markdown()
    bodies = [
        "text\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n| `x` & y | <b>z</b> |\n| only one |\n| 1 | 2 | 3 |\n\nafter",
        "| h *em* | [link](x.csv) |\n| --- | --- |\n| a_b_c | ![img](p.png) |\n| &lt; | \"q\" 'r' ~s~ |\n",
        "para\n| a | b |\n| --- | --- |\n| 1 | 2 |",
        "| a | b |\n| --- | --- |\n| 1 \\| 2 | 3 |\n\n| c |\n| --- |\n| d |\ntrailing text",
        "```\n| a |\n| --- |\n```\n\n| a |\n| --- |\n",
        "| a | b |\n| --- | --- | --- |\n| 1 | 2 |\n\n- item\n\n| x |\n| --- |\n|  padded  |\n\n",
        "| a |\n| :--- |\n| 1 |\n\n| e |\n| --- |\n",
    ]
    for body in bodies:
        assert render_markdown(md, body) == md.render(body), body
