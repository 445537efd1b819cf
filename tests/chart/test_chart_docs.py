"""The chart's documentation: the README's values table is what scripts/gen_values_table.py makes
of values.yaml (every key documented), and NOTES.txt tells how to follow, fetch and uninstall."""
from __future__ import annotations

import importlib.util

import pytest

from chart_helpers import CHART, REPO, VALUES_DIR, helm_cmd, render


def _gen():
    spec = importlib.util.spec_from_file_location("gen_values_table", REPO / "scripts" / "gen_values_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_values_table_is_current():
    gen = _gen()
    readme = (CHART / "README.md").read_text()
    assert gen.render_readme(readme, gen.table()) == readme, \
        "chart/README.md is stale: run python scripts/gen_values_table.py"
    assert gen.main(["--check"]) == 0


def test_every_values_key_is_documented():
    import yaml

    gen = _gen()
    text = (CHART / "values.yaml").read_text()
    docs = gen.documented_keys(text)
    assert gen.undocumented(yaml.safe_load(text), docs) == []
    assert all(len(d) > 10 for d in docs.values()), [k for k, d in docs.items() if len(d) <= 10]


def test_an_undocumented_key_is_reported():
    import yaml

    gen = _gen()
    text = "# -- documented\na: 1\nb:\n  # -- nested, documented\n  c: 2\n  d: 3\n"
    assert gen.documented_keys(text) == {"a": "documented", "b.c": "nested, documented"}
    assert gen.undocumented(yaml.safe_load(text), gen.documented_keys(text)) == ["b.d"]


def test_a_stale_table_is_detected(tmp_path, monkeypatch):
    gen = _gen()
    chart = tmp_path / "chart"
    chart.mkdir()
    for name in ("values.yaml", "values.schema.json", "README.md"):
        (chart / name).write_text((CHART / name).read_text())
    values = chart / "values.yaml"
    values.write_text(values.read_text().replace("masterPort: 29500", "masterPort: 29600"))
    monkeypatch.setattr(gen, "CHART", chart)
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert "`29600`" in (chart / "README.md").read_text()


@pytest.mark.parametrize("values", ["cpu.yaml", "h100.yaml"])
def test_notes_tell_how_to_follow_fetch_and_uninstall(values):
    # helm 4 renders NOTES offline (install --dry-run=client); helm 3.19 wants a cluster for it.
    proc = helm_cmd("helm4", "install", "zero3-w16", str(CHART), "-f", str(VALUES_DIR / values),
                    "--namespace", "bench", "--dry-run=client", "--set", "persistence.enabled=true")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n bench logs -f -l training.kubeflow.org/job-name=zero3-w16-shardbench," \
           "training.kubeflow.org/job-role=launcher" in notes
    shape = values.removesuffix(".yaml")
    # The record lands where `shardbench report` looks for it (results/<set>/<run>/result.json).
    assert f"shardbench collect zero3-w16.log -o results/{shape}/zero3-w16/result.json" in notes
    assert f"shardbench report results/{shape} --out reports/{shape}" in notes
    assert "helm test zero3-w16 -n bench" in notes
    assert "helm uninstall zero3-w16 -n bench" in notes
    # The planner's prediction of this very run (docs/planner.md), a command the reader can run.
    plan = next(line.strip() for line in notes.splitlines() if line.strip().startswith("shardbench plan"))
    assert f"--shape {shape} --strategy" in plan and "--world-size" in plan and "--micro-batch" in plan


@pytest.mark.parametrize("mode", ["K8sJobMode", "HTTPMode"])
def test_rayjob_notes_tell_how_to_follow_the_driver_open_the_dashboard_and_get_the_record(mode):
    """With ray.enabled the release is a RayJob: NOTES used to describe only the MPIJob (its
    launcher pod, which a RayJob has none of)."""
    proc = helm_cmd("helm4", "install", "ddp-w2", str(CHART), "-f", str(VALUES_DIR / "cpu.yaml"), "--namespace",
                    "bench", "--dry-run=client", "--set", "persistence.enabled=true", "--set", "ray.enabled=true",
                    "--set", f"ray.submissionMode={mode}", "--set", "ray.maxRestarts=2")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert f"a KubeRay RayJob ({mode}; the driver relaunches the ranks up to 2 time(s))" in notes
    assert "kubectl -n bench get rayjob ddp-w2-shardbench -w" in notes
    assert "mpijob" not in notes.lower() and "training.kubeflow.org" not in notes and "launcher pod" not in notes
    # The dashboard: the head service of the RayCluster KubeRay named for this RayJob.
    assert ("kubectl -n bench port-forward svc/$(kubectl -n bench get rayjob ddp-w2-shardbench -o "
            "jsonpath='{.status.rayClusterName}')-head-svc 8265:8265") in notes
    if mode == "K8sJobMode":  # the submitter Job, named after the RayJob, prints the driver's output
        assert "kubectl -n bench logs -f job/ddp-w2-shardbench" in notes
        assert "kubectl -n bench logs job/ddp-w2-shardbench --tail=-1 > ddp-w2.log" in notes
    else:  # no submitter Job: the Ray job's own log, on the head
        head = ("kubectl -n bench exec $(kubectl -n bench get pod -l app.kubernetes.io/instance=ddp-w2,"
                "app.kubernetes.io/component=ray-head -o name) -- ray job logs ")
        job_id = "$(kubectl -n bench get rayjob ddp-w2-shardbench -o jsonpath='{.status.jobId}')"
        assert f"{head}--follow {job_id}" in notes and f"{head}{job_id} > ddp-w2.log" in notes
    assert "shardbench collect ddp-w2.log -o results/cpu/ddp-w2/result.json" in notes
    assert "helm uninstall ddp-w2 -n bench" in notes and "deletes the RayJob, its RayCluster and pods" in notes
    # The selectors in it select what the chart renders: the head pod's labels, the RayJob's name.
    rayjob = next(d for d in render("helm4", ("cpu.yaml",), ("ray.enabled=true",)) if d["kind"] == "RayJob")
    head_labels = rayjob["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["metadata"]["labels"]
    assert head_labels["app.kubernetes.io/component"] == "ray-head"
    assert head_labels["app.kubernetes.io/instance"] == rayjob["metadata"]["name"].removesuffix("-shardbench")


def test_preflight_notes_say_where_the_verdict_is():
    proc = helm_cmd("helm4", "install", "pf", str(CHART), "-f", str(VALUES_DIR / "h100.yaml"), "--namespace", "bench",
                    "--dry-run=client", "--set", "mode=preflight", "--set", "workers=2")
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "expected 400 GB/s across nodes" in notes and "preflight: FAIL" in notes
    assert "kubectl -n bench get mpijob pf-shardbench" in notes and "helm uninstall pf -n bench" in notes


def _install_examples() -> list[tuple[str, list[str]]]:
    """Every `helm install NAME ./chart ...` line of README.md and chart/README.md, as argv."""
    import re
    import shlex

    found = []
    for doc in (REPO / "README.md", CHART / "README.md"):
        text = doc.read_text().replace("\\\n", " ").replace("$IMG", "--set image.repository=r/shardbench")
        for m in re.finditer(r"helm install ([a-z0-9-]+) \./chart([^`\n]*)", text):
            found.append((f"{doc.relative_to(REPO)}: {m.group(0)[:60]}", [m.group(1), *shlex.split(m.group(2))]))
    return found


@pytest.mark.parametrize("where, argv", _install_examples(), ids=[w for w, _ in _install_examples()])
def test_every_documented_install_renders_and_is_named_for_its_ranks(where, argv):
    """The docs' install examples work as written (with an image repository), and a release
    named <strategy>-w<N> really runs N ranks."""
    import re

    import yaml

    name, rest = argv[0], [a.replace("values/", str(REPO / "values") + "/") for a in argv[1:]]
    rest = [a for a in rest if a not in ("-n", "bench", "--wait")]
    assert "image.repository=" in " ".join(rest), f"{where}: no --set image.repository"
    proc = helm_cmd("helm4", "template", name, str(CHART), *rest)
    assert proc.returncode == 0, f"{where}: {proc.stderr}"
    job = next(d for d in yaml.safe_load_all(proc.stdout) if d and d.get("kind") == "MPIJob")
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]
    ranks = worker["replicas"] * job["spec"]["slotsPerWorker"]
    m = re.fullmatch(r"[a-z0-9]+-w(\d+)", name)
    if m:
        assert int(m.group(1)) == ranks, f"{where}: {name} runs {ranks} ranks"
