"""report.html: the report as one self-contained file to share (mail it, attach it to a ticket).

The same analysis as BENCHMARK_REPORT.md (suite/analysis.py): verdicts, flags,
recommendations, one row per configuration with 95% intervals, the runs that did not finish ok,
and every plot. Self-contained: the plots are PNGs embedded as data: URIs, the style and the
table sorting are inline, and a Content-Security-Policy forbids any other source, so the file
opens offline and never reaches the network. Click a column header to sort (again: reverse);
empty cells sort last either way.
"""
from __future__ import annotations

import base64
import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from shardbench.suite import summary
from shardbench.suite.analysis import Analysis
from shardbench.suite.stats import Estimate, finite

FILENAME = "report.html"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

# (header, how to get the value from a Config, format): the columns of the configurations table.
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
    ("flags", lambda c: "; ".join(c.flags) or c.efficiency_note, "{}"),
]

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1400px;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.sortable th{cursor:pointer;background:#f3f3f3;user-select:none}
th[aria-sort=ascending]::after{content:" \\25B2"}th[aria-sort=descending]::after{content:" \\25BC"}
tr.flagged td{background:#fff6d5}tr.broken td{background:#ffd9d9}tr.notok td{color:#a00}
.winner{color:#060;font-weight:600}.muted{color:#777}
figure{display:inline-block;margin:.5em;vertical-align:top}figure img{max-width:640px;border:1px solid #eee}
.rules{white-space:pre-wrap;font-size:12.5px;background:#fafafa;padding:.6em;border:1px solid #eee}
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


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _number(value: Any) -> float | None:
    if isinstance(value, Estimate):
        return value.mean
    return float(value) if finite(value) else None


def _text(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not finite(value)):
        return ""
    if isinstance(value, Estimate):
        text = spec.format(value.mean)
        return f"{text} [{spec.format(value.lo)}, {spec.format(value.hi)}]" if value.has_interval else text
    try:
        return spec.format(value)
    except (TypeError, ValueError):
        return str(value)


def cell(value: Any, spec: str = "{}") -> str:
    """A <td> showing the formatted value, sorting by the raw number (an estimate by its mean)."""
    number = _number(value)
    sort = number if number is not None else ("" if value is None else str(value))
    cls = ' class="num"' if number is not None else ""
    return f'<td{cls} data-v="{esc(sort)}">{esc(_text(value, spec))}</td>'


def table(headers: list[str], rows: list[str], sortable: bool = True) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def configs_table(an: Analysis) -> str:
    rows = []
    for c in an.configs:
        cls = "broken" if c.broken else "flagged" if c.flags else ""
        cells = "".join(cell(get(c), spec) for _, get, spec in CONFIG_COLUMNS)
        rows.append(f'<tr class="{cls}">{cells}</tr>')
    return table([h for h, _, _ in CONFIG_COLUMNS], rows)


def verdicts_table(an: Analysis) -> str:
    if not an.verdicts:
        return '<p class="muted">No verdict: needs at least two strategies with ok runs at the same size.</p>'
    rows = []
    for v in an.verdicts:
        kind = f'<td data-v="{esc(v.kind)}" class="{"winner" if v.kind == "winner" else ""}">{esc(v.kind)}</td>'
        rows.append(f"<tr>{cell(v.category.name)}{cell(v.group)}{kind}"
                    f"{cell(summary.answer(v).replace('**', ''))}{cell(v.category.show(v.best.get(v.category.metric)))}"
                    f"{cell(v.text.replace('**', ''))}</tr>")
    return table(["category", "group", "verdict", "answer (vs the best)", "best value [95%]", "why"], rows)


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


def flags_list(an: Analysis) -> str:
    flagged = [c for c in an.configs if c.flags]
    if not flagged:
        return '<p class="muted">No configuration flagged.</p>'
    return "<ul>" + "".join(f"<li><b>{esc(c.label)}</b> ({esc(c.name)}): {esc('; '.join(c.flags))}</li>"
                            for c in flagged) + "</ul>"


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


def render(an: Analysis, results_dir: Path, plot_files: list[Path], rules: str = "") -> str:
    runs, not_ok = len(an.runs), len(an.not_ok)
    generated = datetime.now(timezone.utc).isoformat(timespec="seconds")
    recs = "".join(f"<li>{esc(r.replace('**', ''))}</li>" for r in an.recommendations)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>shardbench report: {esc(results_dir)}</title><style>{STYLE}</style>",
        f"<script>{SCRIPT}</script></head><body>",
        "<h1>shardbench benchmark report</h1>",
        f'<p>Generated {esc(generated)} from <code>{esc(results_dir)}</code>: {runs} runs, '
        f"{len(an.configs)} configurations with ok runs, {not_ok} runs not ok. Values are means over "
        "a configuration's ok repeats with 95% Student-t intervals [low, high]; click a column header "
        "to sort.</p>",
        "<h2>Verdicts</h2>", verdicts_table(an),
        "<h2>Recommendations</h2>", f"<ul>{recs}</ul>" if recs else '<p class="muted">None.</p>',
        "<h2>Flagged (never crowned)</h2>", flags_list(an),
        "<h2>Configurations</h2>", configs_table(an),
        "<h2>Runs not ok</h2>", not_ok_table(an),
        "<h2>Plots</h2><p>Error bars are 95% intervals.</p>", figures(plot_files),
    ]
    if rules:
        parts += ["<h2>How this report decides</h2>", f'<div class="rules">{esc(rules)}</div>']
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(an: Analysis, results_dir: Path, plot_files: list[Path], out_dir: Path, rules: str = "") -> Path:
    path = Path(out_dir) / FILENAME
    path.write_text(render(an, results_dir, plot_files, rules), encoding="utf-8")
    return path

