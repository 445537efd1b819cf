"""report.html: the report as one self-contained file to share (mail it, attach it to a ticket).

Everything BENCHMARK_REPORT.md says, in its order (Summary first; setup and versions, memory
breakdown, scaling, loss check, faults, tuning, plan vs measurement), rendered from that very
markdown (markdown-it, raw HTML escaped) so the two cannot drift; three sections are richer here:
Verdicts and the configurations (sortable tables; intervals under the mean and flags folded in
<details>, so the page fits 1,280 px without horizontal scroll) and the plots (embedded PNGs).
Self-contained: the plots are data: URIs, links become plain text, the style and the table
sorting are inline, and a Content-Security-Policy forbids any other source, so the file opens
offline and never reaches the network. Click a column header to sort (again: reverse); empty
cells sort last either way.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.common.utils import mdTrim

from shardbench.suite.analyze import groups
from shardbench.suite.report import summary
from shardbench.suite.analyze.analysis import Analysis, MeasuredConfig
from shardbench.suite.analyze.stats import Estimate, finite

FILENAME = "report.html"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

# (header, how to get the value from a MeasuredConfig, format): the columns of the configurations table.
CONFIG_COLUMNS: list[tuple[str, Any, str]] = [
    ("configuration", lambda c: c.name, "{}"),
    ("strategy", lambda c: c.strategy, "{}"),
    ("devices", lambda c: c.world_size, "{:.0f}"),
    ("seq", lambda c: c.seq_len, "{:.0f}"),
    ("n", lambda c: c.n, "{}"),
    ("tok/s [95%]", lambda c: c.get("tokens_per_s"), "{:,.0f}"),
    ("step s [95%]", lambda c: c.get("step_time_mean_s"), "{:.4f}"),
    ("model state GiB/rank", lambda c: c.get("model_state_gib_per_rank"), "{:.4g}"),
    ("GPU peak GiB", lambda c: c.get("train_peak_gib"), "{:.3f}"),
    ("MFU", lambda c: c.get("mfu"), "{:.2%}"),
    ("scaling eff. [95%]", lambda c: c.efficiency, "{:.2f}"),
    ("speedup [95%]", lambda c: c.speedup, "{:.2f}"),
    ("$/Mtok", lambda c: c.get("cost_usd_per_mtok"), "{:.4g}"),
]
"""A column no configuration has a value for (GPU peak and MFU on CPU, $ without a price) is left out."""

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1240px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:13px;max-width:100%}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
td.num{text-align:right;font-variant-numeric:tabular-nums}
th{overflow-wrap:normal}
.ci{display:block;color:#666;font-size:11.5px;white-space:nowrap}
table.sortable th{cursor:pointer;background:#f3f3f3;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tr.flagged td{background:#fff6d5}tr.broken td{background:#ffd9d9}tr.notok td{color:#a00}
.winner{color:#060;font-weight:600}.muted{color:#777}
details summary{cursor:pointer;color:#555}
code{font-size:12px;overflow-wrap:anywhere}
figure{display:inline-block;margin:.5em;vertical-align:top}figure img{max-width:600px;width:100%;border:1px solid #eee}
"""

SCRIPT = """
function cellValue(td){const v=td.getAttribute('data-v');if(v===null||v==='')return null;
  const n=Number(v);return isNaN(n)?v.toLowerCase():n;}
function sortTable(th){const table=th.closest('table'),body=table.tBodies[0];
  const idx=Array.prototype.indexOf.call(th.parentNode.children,th);
  const asc=th.getAttribute('aria-sort')!=='ascending';
  for(const h of th.parentNode.children)h.removeAttribute('aria-sort');
  th.setAttribute('aria-sort',asc?'ascending':'descending');
  const rows=Array.from(body.rows);
  rows.sort(function(a,b){const x=cellValue(a.cells[idx]),y=cellValue(b.cells[idx]);
    if(x===null&&y===null)return 0;if(x===null)return 1;if(y===null)return -1;
    const r=(typeof x===typeof y)?(x<y?-1:x>y?1:0):(typeof x==='number'?-1:1);return asc?r:-r;});
  for(const r of rows)body.appendChild(r);}
document.addEventListener('DOMContentLoaded',function(){
  for(const th of document.querySelectorAll('table.sortable th'))
    th.addEventListener('click',function(){sortTable(th);});});
"""

COLLAPSED = ("Host load", "Columns of metrics.csv", "How this report decides")
"""Sections a reader opens on demand (long, for checking rather than for the answer)."""


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _number(value: Any) -> float | None:
    if isinstance(value, Estimate):
        return value.mean
    return float(value) if finite(value) else None


def _text(value: Any, spec: str) -> str:
    """The cell's HTML: an estimate's mean with its interval on a line of its own below."""
    if value is None or (isinstance(value, float) and not finite(value)):
        return ""
    if isinstance(value, Estimate):
        text = esc(spec.format(value.mean))
        if value.has_interval and value.lo != value.hi:
            text += f'<span class="ci">[{esc(spec.format(value.lo))}, {esc(spec.format(value.hi))}]</span>'
        return text
    try:
        return esc(spec.format(value))
    except (TypeError, ValueError):
        return esc(value)


def cell(value: Any, spec: str = "{}") -> str:
    """A <td> showing the formatted value, sorting by the raw number (an estimate by its mean)."""
    number = _number(value)
    sort = number if number is not None else ("" if value is None else str(value))
    cls = ' class="num"' if number is not None else ""
    return f'<td{cls} data-v="{esc(sort)}">{_text(value, spec)}</td>'


def table(headers: list[str], rows: list[str], sortable: bool = True, ident: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    cls = ' class="sortable"' if sortable else ""
    idattr = f' id="{ident}"' if ident else ""
    return f"<table{idattr}{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _flags_cell(c: MeasuredConfig) -> str:
    text = "; ".join(c.flags)
    if not text:
        return f'<td data-v="">{esc(c.efficiency_note)}</td>'
    return (f'<td data-v="{esc(text)}"><details><summary>{len(c.flags)} flag{"s" if len(c.flags) > 1 else ""}'
            f"</summary>{esc(text)}</details></td>")


def configs_table(an: Analysis) -> str:
    columns = [col for col in CONFIG_COLUMNS if any(_number(col[1](c)) is not None or isinstance(col[1](c), str)
                                                      for c in an.configs)]
    varying = groups.differences([c.settings for c in an.configs],
                                 groups.VERDICT_EXCEPT | groups.LAYOUT | {"seq_len", "resolved_global_batch"})
    rows = []
    for c in an.configs:
        cls = "broken" if c.broken else "flagged" if c.flags else ""
        cells = "".join(cell(get(c), spec) for _, get, spec in columns)
        knobs = ", ".join(t for k in varying if (t := groups.shown(k, c.settings.get(k))))
        rows.append(f'<tr class="{cls}">{cells}{cell(knobs) if varying else ""}{_flags_cell(c)}</tr>')
    return table([h for h, _, _ in columns] + (["settings"] if varying else []) + ["flags"], rows,
                 ident="configurations")


def verdicts_table(an: Analysis) -> str:
    if not an.verdicts:
        return '<p class="muted">No verdict: needs at least two strategies with ok runs at the same size.</p>'
    rows = []
    for v in an.verdicts:
        kind = f'<td data-v="{esc(v.kind)}" class="{"winner" if v.kind == "winner" else ""}">{esc(v.kind)}</td>'
        why = v.text.replace("**", "")
        rows.append(f"<tr>{cell(v.category.name)}{cell(v.group)}{kind}"
                    f"{cell(summary.answer(v).replace('**', ''))}"
                    f'<td data-v="{esc(why)}"><details><summary>numbers, test</summary>{esc(why)}</details></td></tr>')
    return table(["category", "group", "verdict", "answer (vs the best)", "why"], rows, ident="verdicts")


def not_ok_table(an: Analysis) -> str:
    bad = an.not_ok
    if bad.empty:
        return '<p class="muted">Every run finished ok.</p>'
    rows = [f'<tr class="notok">{cell(r["run_id"])}{cell(r["status"])}{cell(r["strategy"])}'
            f'{cell(r["world_size"], "{:.0f}")}{cell(_one_line(r["error"]))}</tr>'
            for _, r in bad.iterrows()]
    return table(["run", "status", "strategy", "devices", "reason"], rows)


def _one_line(error: Any) -> str:
    return " ".join(error.split())[:400] if isinstance(error, str) else ""


def data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def figures(plot_files: list[Path]) -> str:
    out = []
    for p in plot_files:
        try:
            uri = data_uri(p)
        except OSError:
            continue  # a plot that vanished is left out, the report still opens
        out.append(f'<figure><img alt="{esc(p.stem)}" src="{uri}"><figcaption>{esc(p.stem.replace("_", " "))}'
                   "</figcaption></figure>")
    return "".join(out) or '<p class="muted">No plot had data.</p>'


def _markdown() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    # Self-contained: a link (to metrics.csv, ...) would break once the file is mailed; keep its text.
    md.add_render_rule("link_open", lambda *_: "")
    md.add_render_rule("link_close", lambda *_: "")
    # markdown-it binds a render rule to its renderer: the first argument is the renderer.
    md.add_render_rule("image", lambda _renderer, tokens, idx, *_: esc(tokens[idx].content))
    return md


_PLAIN = re.compile(r"[^\\`*_\[\]<>&!~\"'\t\r\x00]*")
"""A table cell with nothing markdown-it would parse or escape: its HTML is its text."""
_DELIMITER = re.compile(r"\|(?: --- \|)+")
_MAX_PADDED_CELLS = 0x10000
"""markdown-it stops a table after this many cells padded in (rules_block/table.py)."""


def render_markdown(md: MarkdownIt, body: str) -> str:
    """md.render(body), byte for byte, with the report's plain pipe tables (a blank line before and
    after, every line starting with `|`, delimiter row `| --- |...`, no backslash) rendered here:
    markdown-it spent ~60 us a cell, 3 s of a 5,000-run report on the plan table's 4,700 rows.
    Cells with inline markup still go through md.renderInline; anything else falls back to
    md.render (tests/suite/test_html_report.py compares the two)."""
    if "```" in body or "~~~" in body:
        return md.render(body)
    lines, i = body.split("\n"), 0
    out: list[str] = []
    text: list[str] = []
    while i < len(lines):
        if (lines[i].startswith("|") and i + 1 < len(lines) and _DELIMITER.fullmatch(lines[i + 1])
                and (not text or not mdTrim(text[-1]))):
            end = i + 2
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            table = _table(md, lines[i:end]) if end == len(lines) or not mdTrim(lines[end]) else None
            if table is not None:
                out.append(md.render("\n".join(text)) if text else "")
                out.append(table)
                text, i = [], end
                continue
        text.append(lines[i])
        i += 1
    if text:
        out.append(md.render("\n".join(text)))
    return "".join(out)


def _cells(line: str) -> list[str]:
    """A row's cells as markdown-it splits them (no backslash: no escaped pipe)."""
    cols = mdTrim(line).split("|")
    if cols and cols[0] == "":
        cols.pop(0)
    if cols and cols[-1] == "":
        cols.pop()
    return cols


def _table(md: MarkdownIt, lines: list[str]) -> str | None:
    """The HTML markdown-it makes of this table, or None when it is not one of the plain ones."""
    if any("\\" in line for line in lines):
        return None
    header, width = _cells(lines[0]), lines[1].count("---")
    if len(header) != width:
        return None

    def cell(text: str, tag: str) -> str:
        text = mdTrim(text)
        return f"<{tag}>{text if _PLAIN.fullmatch(text) else md.renderInline(text)}</{tag}>\n"

    padded, rows = 0, []
    for line in lines[2:]:
        cols = _cells(line)
        padded += width - len(cols)
        if padded > _MAX_PADDED_CELLS:
            return None
        cols += [""] * (width - len(cols))
        rows.append("<tr>\n" + "".join(cell(c, "td") for c in cols[:width]) + "</tr>\n")
    head = "<table>\n<thead>\n<tr>\n" + "".join(cell(c, "th") for c in header) + "</tr>\n</thead>\n"
    return head + ("<tbody>\n" + "".join(rows) + "</tbody>\n" if rows else "") + "</table>\n"


def sections(markdown: str) -> list[tuple[str, str]]:
    """BENCHMARK_REPORT.md as (heading, body) per '## ' section; the text before the first is ('', ...)."""
    out: list[tuple[str, str]] = []
    heading, body = "", list[str]()
    for line in markdown.splitlines():
        if line.startswith("## "):
            out.append((heading, "\n".join(body)))
            heading, body = line[3:].strip(), []
        elif not line.startswith("# "):
            body.append(line)
    out.append((heading, "\n".join(body)))
    return out


def render(an: Analysis, results_dir: Path, plot_files: list[Path], markdown: str) -> str:
    md = _markdown()
    special = {
        "Verdicts": lambda: verdicts_table(an),
        "Results": lambda: ("<p>Per configuration: mean with its 95% interval below (n = ok repeats); click a "
                            "header to sort, a flag count to read the flags.</p>" + configs_table(an)),
        "Plots": lambda: "<p>Error bars are 95% intervals (clipped where wider than the plot; see the plot).</p>"
                         + figures(plot_files),
        "Failed and unreadable runs": lambda: not_ok_table(an),
    }
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>shardbench report: {esc(results_dir)}</title><style>{STYLE}</style>",
        f"<script>{SCRIPT}</script></head><body>",
        "<h1>shardbench benchmark report</h1>",
    ]
    for heading, body in sections(markdown):
        content = special[heading]() if heading in special else render_markdown(md, body)
        if heading in COLLAPSED:
            parts.append(f'<details><summary><h2 style="display:inline">{esc(heading)}</h2></summary>'
                         f"{content}</details>")
        else:
            parts.append((f"<h2>{esc(heading)}</h2>" if heading else "") + content)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(an: Analysis, results_dir: Path, plot_files: list[Path], out_dir: Path, markdown: str) -> Path:
    path = Path(out_dir) / FILENAME
    path.write_text(render(an, results_dir, plot_files, markdown), encoding="utf-8")
    return path
