"""Real servers for the monitoring tests: Debian's Prometheus (run from the binary that
scripts/install-tools.sh unpacks into .tools/prometheus/) scraping a live two-rank trainer run.

A missing binary fails the tests (it never skips them), as the chart tests do with helm.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).resolve().parent
for extra in (HERE, HERE.parent / "chart"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from chart_helpers import RELEASE, REPO, TOOLS, helm_cmd, render, tool  # noqa: E402,F401

PROMETHEUS = TOOLS / "prometheus" / "prometheus"
PROMTOOL = TOOLS / "prometheus" / "promtool"
SCRAPE = "250ms"
# Every monitoring object on, with a throughput expectation for the alert's hook.
METRICS_SETS = ("metrics.enabled=true", "metrics.podMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
                "metrics.dashboard.enabled=true")


def free_port() -> int:
    from shardbench.trainer import ports

    return ports.free_port("127.0.0.1")


def port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def rendered(kind: str, sets: tuple[str, ...] = METRICS_SETS) -> list[dict]:
    return [d for d in render("helm3", (), sets) if d["kind"] == kind]


def chart_rule_groups(release: str = RELEASE) -> dict:
    """The PrometheusRule's spec of `release` as a Prometheus rule file ({groups: [...]})."""
    if release == RELEASE:
        (rule,) = rendered("PrometheusRule")
    else:
        proc = helm_cmd("helm3", "template", release, str(REPO / "chart"), *[a for s in METRICS_SETS for a in ("--set", s)])
        assert proc.returncode == 0, proc.stderr
        (rule,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]
    return {"groups": rule["spec"]["groups"]}


def dashboard() -> dict:
    (cm,) = [d for d in rendered("ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    (body,) = cm["data"].values()
    return json.loads(body)


class PromAPI:
    def __init__(self, url: str):
        self.url = url

    def get(self, path: str, **params) -> dict:
        q = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{q}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict]:
        return self.get("/api/v1/query", query=expr, time=f"{at:.3f}")["result"]

    def value(self, expr: str, at: float) -> float:
        result = self.query(expr, at)
        assert len(result) == 1, (expr, result)
        return float(result[0]["value"][1])


@dataclass
class LiveRun:
    api: PromAPI
    record: dict
    start: float
    end: float
    log: str
    first_record: dict
    """The record of the earlier run it resumed from (its checkpoint's)."""


def start_prometheus(tmp: Path, targets: list[str], rules: dict | None = None) -> tuple[subprocess.Popen, PromAPI]:
    port = free_port()
    config = {"global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE, "evaluation_interval": SCRAPE},
              # The release label the chart's PodMonitor puts on its targets (its rules select by it).
              "scrape_configs": [{"job_name": "shardbench",
                                  "static_configs": [{"targets": targets, "labels": {"release": RELEASE}}]}]}
    if rules is not None:
        (tmp / "rules.yaml").write_text(yaml.safe_dump(rules))
        config["rule_files"] = [str(tmp / "rules.yaml")]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([tool(PROMETHEUS), f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return proc, PromAPI(url)
        except OSError:
            time.sleep(0.2)
        if proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"prometheus did not start:\n{(tmp / 'prometheus.log').read_text()[-2000:]}", pytrace=False)


@pytest.fixture(scope="session")
def live_run(tmp_path_factory) -> LiveRun:
    """A real two-rank ddp run (torchrun, gloo) scraped every 250 ms by a real Prometheus that
    also evaluates the chart's alert rules. Every rank exports (rank 0 on the port, rank 1 on the
    port + 1). The run resumes from a checkpoint an earlier, identical run left (60 steps, one every
    25) and saves every 5 steps itself (step 55 is a checkpoint step; the last step never saves), so checkpoint load,
    saves and the restart are live too; the ranks hold their final values 2 s."""
    from tests.trainer.conftest import command, cpu_env  # the trainer launch helpers
    from shardbench.trainer.record import END_MARKER, START_MARKER

    tmp = tmp_path_factory.mktemp("prom")
    args = ["--strategy", "ddp", "--seq-len", "32", "--micro-batch", "2", "--steps", "60", "--warmup-steps", "2",
            "--device", "cpu", "--precision", "fp32", "--checkpoint-dir", str(tmp / "ckpt"),
            "--checkpoint-every", "25", "--run-id", "live-prom-r0"]
    first = subprocess.run(command(args, "torchrun", 2, tmp), cwd=REPO, env=cpu_env(), capture_output=True,
                           text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    first_record = json.loads(first.stdout.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0])
    port = free_port()
    while not port_free(port + 1):
        port = free_port()
    prom, api = start_prometheus(tmp, [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"], chart_rule_groups())
    args[args.index("--checkpoint-every") + 1] = "5"
    args += ["--resume-allow", "checkpointing", "--metrics-port", str(port), "--metrics-hold-s", "2",
             "--expected-tokens-per-s", "1e9"]
    try:
        start = time.time()
        run = subprocess.run(command(args, "torchrun", 2, tmp), cwd=REPO, env=cpu_env(), capture_output=True,
                             text=True, timeout=240)
        end = time.time()
        assert run.returncode == 0, run.stderr[-3000:]
        record = json.loads(run.stdout.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0])
        time.sleep(1.0)  # one more rule evaluation over the last samples
        yield LiveRun(api, record, start, end, run.stderr, first_record)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
