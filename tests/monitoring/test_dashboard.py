"""The Grafana dashboard the chart ships: every panel's query, run against the real Prometheus
that scraped a live run, returns data. Grafana's variables are substituted as Grafana would:
$run by the run's id, $__rate_interval by a window that covers several scrapes.

The one exception is the GPU panel (NVML utilisation and temperature): a CPU run has no GPU, so
its series do not exist here; the test names it and checks it is the only panel left empty."""
from __future__ import annotations

import pytest

import json

import yaml

from tests.monitoring.conftest import REPO, dashboard

GPU_ONLY = {"GPU utilisation", "GPU temperature"}


def _expr(expr: str) -> str:
    return expr.replace("$run", "live-prom-r0").replace("$__rate_interval", "2s")


@pytest.mark.slow
def test_every_panel_query_returns_data(live_run):
    dash = dashboard()
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource", "run"]
    run_values = live_run.api.get("/api/v1/label/run/values", match="shardbench_run_info")
    assert "live-prom-r0" in run_values  # what the $run variable's label_values() lists
    empty, checked = [], 0
    for panel in dash["panels"]:
        for target in panel["targets"]:
            result = live_run.api.get("/api/v1/query_range", query=_expr(target["expr"]), start=f"{live_run.start:.3f}",
                                      end=f"{live_run.end + 1:.3f}", step="0.5")["result"]
            checked += 1
            if not any(series["values"] for series in result):
                empty.append((panel["title"], target["expr"]))
    assert checked >= 15
    assert {title for title, _ in empty} == GPU_ONLY, empty
    gpu = [p for p in dash["panels"] if p["title"] in GPU_ONLY]
    assert all("shardbench_gpu_" in t["expr"] for p in gpu for t in p["targets"])


def test_dashboard_configmap_is_for_the_sidecar():
    """Off by default; on, one ConfigMap with the sidecar's label and the dashboard JSON, whose
    uid and data key are the release's own: two releases no longer share uid `shardbench` and
    one data key (the sidecar kept one of them and dropped it when either was uninstalled)."""
    from tests.monitoring.conftest import METRICS_SETS, helm_cmd, render

    assert not [d for d in render("helm3") if d["metadata"]["name"].endswith("-dashboard")]
    seen = {}
    for release in ("sb", "sb-2", "a-very-long-release-name-for-a-sweep-r0", "a-very-long-release-name-for-a-sweep-r1"):
        proc = helm_cmd("helm3", "template", release, str(REPO / "chart"), *[a for s in METRICS_SETS for a in ("--set", s)])
        assert proc.returncode == 0, proc.stderr
        (cm,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["metadata"]["name"].endswith("-dashboard")]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, body),) = cm["data"].items()
        dash = json.loads(body)
        assert len(dash["uid"]) <= 40 and dash["title"] == f"shardbench ({release})"
        seen[release] = (key, dash["uid"])
    assert len({k for k, _ in seen.values()}) == len({u for _, u in seen.values()}) == len(seen), seen


def test_dashboard_units_descriptions_and_runbook_link():
    dash = dashboard()
    assert all(p.get("description") for p in dash["panels"]), [p["title"] for p in dash["panels"] if not p.get("description")]
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in dash["panels"]}
    assert units["GPU temperature"] == "celsius" and units["GPU utilisation"] == "percentunit"
    assert [link["url"] for link in dash["links"]] == ["docs/monitoring.md"]  # metrics.runbookUrl
    exprs = {p["title"]: [t["expr"] for t in p["targets"]] for p in dash["panels"]}
    assert exprs["Loss"] == ['avg by (run) (shardbench_loss{run=~"$run"})']  # the record's mean over ranks
    assert exprs["Restarts"] == ['shardbench_restarts_total{run=~"$run"}']
