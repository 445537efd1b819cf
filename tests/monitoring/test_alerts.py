"""The chart's alert rules, as rendered, pass `promtool check rules`, and every alert has a
promtool unit test that fires it and keeps it silent where it must (alerts_test.yaml), with the
rules of two releases loaded side by side: each alerts once per condition, on its own series."""
from __future__ import annotations

import subprocess

import yaml

from tests.monitoring.conftest import HERE, PROMTOOL, chart_rule_groups, tool


ALERTS = {"TrainingStalled", "NoFirstStep", "RankDown", "ThroughputBelowExpectation", "StepTimeVariance",
          "NCCLEnvDisagreement"}


def _write_rules(tmp_path, release="sb"):
    rules = tmp_path / f"rules-{release}.yaml"
    rules.write_text(yaml.safe_dump(chart_rule_groups(release)))
    return rules


def test_rendered_rules_pass_promtool_check(tmp_path):
    rules = _write_rules(tmp_path)
    proc = subprocess.run([tool(PROMTOOL), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 6 rules found" in proc.stdout


def test_every_alert_has_a_passing_unit_test(tmp_path):
    cases = yaml.safe_load((HERE / "alerts_test.yaml").read_text())
    cases["rule_files"] = [str(_write_rules(tmp_path)), str(_write_rules(tmp_path, "other"))]
    (tmp_path / "alerts_test.yaml").write_text(yaml.safe_dump(cases))
    alerts = {r["alert"] for g in chart_rule_groups()["groups"] for r in g["rules"]}
    assert alerts == ALERTS
    fired = {c["alertname"] for t in cases["tests"] for c in t["alert_rule_test"] if c["exp_alerts"]}
    silent = {c["alertname"] for t in cases["tests"] for c in t["alert_rule_test"] if not c["exp_alerts"]}
    assert fired == alerts, f"alerts never fired by a unit test: {alerts - fired}"
    assert silent >= alerts - {"NCCLEnvDisagreement"}, f"alerts never checked silent: {alerts - silent}"
    # Every expected alert names its release, and both releases' rules fire somewhere.
    expected = [a for t in cases["tests"] for c in t["alert_rule_test"] for a in c["exp_alerts"]]
    assert all(a["exp_labels"]["release"] in ("sb", "other") for a in expected)
    assert {a["exp_labels"]["release"] for a in expected} == {"sb", "other"}
    proc = subprocess.run([tool(PROMTOOL), "test", "rules", str(tmp_path / "alerts_test.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_rules_follow_the_chart_values(tmp_path):
    """The thresholds are the chart's values, not constants of the template."""
    from tests.monitoring.conftest import METRICS_SETS, helm_cmd

    sets = METRICS_SETS + ("metrics.prometheusRule.stalledSeconds=120", "metrics.prometheusRule.noFirstStepSeconds=300")
    args = [a for s in sets for a in ("--set", s)]
    args += ["--set-json", "metrics.prometheusRule.throughputRatio=0.5", "--set-json", "metrics.prometheusRule.stepTimeCv=0.1"]
    proc = helm_cmd("helm3", "template", "sb", str(HERE.parents[1] / "chart"), *args)
    assert proc.returncode == 0, proc.stderr
    (rule,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]
    exprs = {r["alert"]: r["expr"] for r in rule["spec"]["groups"][0]["rules"]}
    assert all('{release="sb"' in e for e in exprs.values()), exprs  # this release's series only
    assert "> 120 " in exprs["TrainingStalled"]
    assert "< 0.5 * max by" in exprs["ThroughputBelowExpectation"]
    assert exprs["StepTimeVariance"].endswith("> 0.1")
    assert exprs["NoFirstStep"].endswith("> 300")
