"""The Grafana dashboard the chart ships: every panel's query, run against the real Prometheus
that scraped a live run, returns data. Grafana's variables are substituted as Grafana would:
$run by the run's id, $__rate_interval by a window that covers several scrapes.

The one exception is the GPU panel (NVML utilisation and temperature): a CPU run has no GPU, so
its series do not exist here; the test names it and checks it is the only panel left empty."""
from __future__ import annotations

import pytest

from tests.monitoring.conftest import dashboard

pytestmark = pytest.mark.slow

GPU_ONLY = {"GPU utilisation", "GPU temperature"}


def _expr(expr: str) -> str:
    return expr.replace("$run", "live-prom-r0").replace("$__rate_interval", "2s")


def test_every_panel_query_returns_data(live_run):
    dash = dashboard()
    assert dash["uid"] == "shardbench" and [v["name"] for v in dash["templating"]["list"]] == ["datasource", "run"]
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
    """Off by default; on, one ConfigMap with the sidecar's label and the dashboard JSON."""
    from tests.monitoring.conftest import render

    assert not [d for d in render("helm3") if d["metadata"]["name"].endswith("-dashboard")]
    assert dashboard()["title"] == "shardbench"
