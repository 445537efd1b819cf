"""The chart's monitoring objects: off by default; on, the PodMonitor and the metrics
NetworkPolicy select worker 0 (where rank 0 runs under either launcher, never the launcher pod),
the NetworkPolicy opens the metrics port and nothing else, the trainer gets the metrics flags and
parses them, the core objects validate strictly, and the schema rejects bad values."""
from __future__ import annotations

import json

import pytest

from chart_helpers import (core_validate, kube_versions_in_range, one, render, replica_pods,
                           template_error)
from tests.monitoring.conftest import METRICS_SETS

MONITORING_KINDS = {"PodMonitor", "PrometheusRule"}


def _ours(docs):
    return [d for d in docs if d["kind"] in MONITORING_KINDS or d["metadata"]["name"].endswith(("-metrics", "-dashboard"))]


@pytest.mark.parametrize("helm", ["helm3", "helm4"])
def test_everything_is_off_by_default(helm):
    docs = render(helm, ("h100.yaml",))
    assert not _ours(docs)
    worker = replica_pods(one(docs, "MPIJob"))["Worker"]
    assert "metrics" not in {p["name"] for p in worker["spec"]["containers"][0]["ports"]}
    args = json.loads(one(docs, "ConfigMap")["data"]["trainer-args.json"])
    assert "--metrics-port" not in args


@pytest.mark.parametrize("launcher", ["mpirun", "deepspeed"])
def test_monitors_select_worker_0_not_the_launcher(launcher):
    docs = render("helm3", (), METRICS_SETS + ("workers=2", f"launcher={launcher}"))
    pods = replica_pods(one(docs, "MPIJob"))
    # The MPI Operator adds the replica index to each worker's labels (v2beta1 newWorker()).
    worker0 = {**pods["Worker"]["metadata"]["labels"], "training.kubeflow.org/replica-index": "0"}
    worker1 = {**worker0, "training.kubeflow.org/replica-index": "1"}
    launcher_labels = pods["Launcher"]["metadata"]["labels"]

    def selects(selector, labels):
        return all(labels.get(k) == v for k, v in selector.items())

    pm = one(docs, "PodMonitor")
    policy = next(d for d in docs if d["metadata"]["name"].endswith("-metrics"))
    for selector in (pm["spec"]["selector"]["matchLabels"], policy["spec"]["podSelector"]["matchLabels"]):
        assert selects(selector, worker0) and not selects(selector, worker1)
        assert not selects(selector, launcher_labels)
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    ports = {p["name"]: p["containerPort"] for p in pods["Worker"]["spec"]["containers"][0]["ports"]}
    assert endpoint["port"] == "metrics" and ports["metrics"] == 9400
    # The NetworkPolicy opens that port alone, to the monitoring namespace by default.
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


def test_trainer_gets_and_parses_the_metrics_flags():
    from shardbench.trainer.config import parse_args

    docs = render("helm3", ("h100.yaml",), METRICS_SETS + ("metrics.expectedTokensPerSecond=250000",
                                                           "metrics.port=9500"))
    (run_cm,) = [d for d in docs if d["kind"] == "ConfigMap" and "trainer-args.json" in d["data"]]
    cfg = parse_args(json.loads(run_cm["data"]["trainer-args.json"]))
    assert (cfg.metrics_port, cfg.metrics_hold_s, cfg.expected_tokens_per_s) == (9500, 30.0, 250000.0)


def test_core_objects_validate_strict():
    docs = render("helm3", ("cpu.yaml",), METRICS_SETS)
    objs = [d for d in _ours(docs) if d["kind"] not in MONITORING_KINDS]
    objs += list(replica_pods(one(docs, "MPIJob")).values())
    assert {o["kind"] for o in objs} == {"NetworkPolicy", "ConfigMap", "Pod"}
    versions = kube_versions_in_range()
    for version in (versions[0], versions[-1]):
        for obj in objs:
            core_validate(obj, version)


def test_no_metrics_policy_in_the_host_network():
    """rdma.mode host-network: no NetworkPolicy applies to hostNetwork pods, so none is rendered."""
    docs = render("helm3", ("h100.yaml",), METRICS_SETS + ("rdma.mode=host-network",))
    assert not [d for d in docs if d["metadata"]["name"].endswith("-metrics")]
    assert one(docs, "PodMonitor")


@pytest.mark.parametrize("bad,expect", [
    ("metrics.port=80", "/metrics/port"),
    ("metrics.enabled=yes", "/metrics/enabled"),
    ("metrics.podMonitor.interval=soon", "/metrics/podMonitor/interval"),
    ("metrics.prometheusRule.stalledSeconds=0", "/metrics/prometheusRule/stalledSeconds"),
    ("metrics.dashboard.colour=red", "colour"),
])
def test_schema_rejects_bad_values(bad, expect):
    assert expect in template_error("helm3", (), (bad,))
