"""The chart's monitoring objects: off by default; on, the PodMonitor and the metrics
NetworkPolicy select every pod that runs ranks (MPIJob workers under either launcher, never the
launcher pod; Ray's worker group, never its head, with ray.enabled), one endpoint per local rank's
port, the NetworkPolicy opens those ports and nothing else, the trainer gets the metrics flags and
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


def selects(selector, labels):
    assert set(selector) == {"matchLabels"}, selector
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def _monitors(docs):
    pm = one(docs, "PodMonitor")
    policy = next(d for d in docs if d["metadata"]["name"].endswith("-metrics"))
    return pm, policy, (pm["spec"]["selector"], policy["spec"]["podSelector"])


def _ports_match(pm, policy, container):
    """One endpoint per local rank's named port, each labelled with the release; the
    NetworkPolicy opens exactly those ports, to the monitoring namespace by default."""
    ports = {p["name"]: p["containerPort"] for p in container["ports"] if p["name"].startswith("metrics")}
    assert ports == {"metrics": 9400, "metrics-1": 9401}
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics", "metrics-1"]
    for endpoint in pm["spec"]["podMetricsEndpoints"]:
        assert endpoint["relabelings"] == [{"targetLabel": "release", "replacement": "sb"}]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 9400}, {"protocol": "TCP", "port": 9401}]
    assert rule["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]


@pytest.mark.parametrize("launcher", ["mpirun", "deepspeed"])
def test_monitors_select_every_worker_not_the_launcher(launcher):
    docs = render("helm3", (), METRICS_SETS + ("workers=2", "gpusPerWorker=2", f"launcher={launcher}",
                                               "networkPolicy.enabled=true"))
    pods = replica_pods(one(docs, "MPIJob"))
    # The MPI Operator adds the replica index to each worker's labels (v2beta1 newWorker()).
    workers = [{**pods["Worker"]["metadata"]["labels"], "training.kubeflow.org/replica-index": str(i)} for i in (0, 1)]
    pm, policy, selectors = _monitors(docs)
    for selector in selectors:
        assert all(selects(selector, w) for w in workers)
        assert not selects(selector, pods["Launcher"]["metadata"]["labels"])
    _ports_match(pm, policy, pods["Worker"]["spec"]["containers"][0])


def test_monitors_select_the_ray_workers_with_ray():
    """ray.enabled: the ranks run in Ray's worker group; nothing selected the Ray pods before."""
    docs = render("helm3", (), METRICS_SETS + ("ray.enabled=true", "workers=2", "gpusPerWorker=2",
                                               "networkPolicy.enabled=true"))
    cluster = one(docs, "RayJob")["spec"]["rayClusterSpec"]
    (group,) = cluster["workerGroupSpecs"]
    head = cluster["headGroupSpec"]["template"]
    pm, policy, selectors = _monitors(docs)
    for selector in selectors:
        assert selects(selector, group["template"]["metadata"]["labels"])
        assert not selects(selector, head["metadata"]["labels"])
    _ports_match(pm, policy, group["template"]["spec"]["containers"][0])
    # The ranks Ray starts are told the port (the driver passes the trainer's args through).
    assert "'--metrics-port' '9400'" in one(docs, "RayJob")["spec"]["entrypoint"]


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
