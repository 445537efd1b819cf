"""The cluster backend under the faults of issue 19, against the kmock emulator (not a real API
server: none can run here) with real helm and the real chart: stale events of an earlier
attempt, API permission errors, a watch answering 410 Gone, releases that are not the suite's."""
from __future__ import annotations

import asyncio
import json

import kmock

from shardbench.suite.backends.kube import api as kapi
from shardbench.suite.backends.kube.values import release_name

from .kube_emulator import NAMESPACE, add_event, add_pod, mpijobs, serve_log, set_conditions, wait_for_mpijob
from .test_kube_backend import backend, cluster, helm, launcher_log, log_lines, run_in_thread, spec  # noqa: F401


async def test_events_older_than_the_attempt_are_ignored(cluster, tmp_path):  # noqa: F811
    """A rerun finds the events of the attempt before it (kept an hour): the launcher Job's old
    FailedCreate must not end the new attempt with its old reason."""
    emu, kubeconfig, helm = cluster  # noqa: F811
    s = spec()
    b = backend(kubeconfig, helm, start_timeout_s=60)
    job = f"{b.release_for(s.run_id)}-shardbench"
    add_event(emu, f"{job}-launcher", "FailedCreate", 'Error creating: pods "x" is forbidden: quota exceeded',
              kind="Job", age_s=600)

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        await asyncio.sleep(0.6)  # a few polls in which the stale event is visible
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 99.0), delay_s=0.01).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(b, s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "ok" and record["tokens_per_s"] == 99.0, record.get("error")
    assert "quota exceeded" not in "\n".join(log_lines(tmp_path / "run"))


def test_two_suites_name_the_same_run_differently(tmp_path):
    a, b = backend(tmp_path / "kc", "helm"), backend(tmp_path / "kc", "helm")
    run_id = "zero3-w16-s4096-mb1-ga8-0123abcd-r12-with-a-long-tail-that-is-cut"
    names = {a.release_for(run_id), b.release_for(run_id)}
    assert len(names) == 2
    assert all(len(n) <= 53 and n.endswith(x.suite) for n, x in zip(sorted(names), sorted((a, b), key=lambda x: x.release_for(run_id))))
    assert a.release_for(run_id) == a.release_for(run_id)  # stable within one suite (reruns, retries)
    assert release_name(run_id, a.suite).startswith("zero3-w16-s4096")


async def test_a_release_of_another_chart_is_refused_not_upgraded(cluster, tmp_path):  # noqa: F811
    emu, kubeconfig, helm = cluster  # noqa: F811
    s = spec()
    b = backend(kubeconfig, helm)
    other = tmp_path / "other-chart"
    (other / "templates").mkdir(parents=True)
    (other / "Chart.yaml").write_text("apiVersion: v2\nname: other\nversion: 1.0.0\n")
    (other / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-data\ndata:\n  keep: me\n")
    proc = await asyncio.create_subprocess_exec(
        str(helm), "install", b.release_for(s.run_id), str(other), "--kubeconfig", str(kubeconfig),
        "--namespace", NAMESPACE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    record, _ = await run_in_thread(b, s, tmp_path / "run")
    assert record["status"] == "failed" and "is not this run's (chart other)" in record["error"], record["error"]
    assert not mpijobs(emu)  # nothing of shardbench was installed over it ...
    live = {name for (res, ns, name), obj in emu.objects.items() if res.plural == "configmaps" and not obj.deleted}
    assert f"{b.release_for(s.run_id)}-data" in live  # ... and the other release was left alone


async def test_a_watch_answering_410_gone_re_lists_the_job(cluster, tmp_path):  # noqa: F811
    """Every watch of the MPIJob answers 410 Gone (its history expired); the operator is slow
    to start the launcher. The backend must read the job itself, not call the operator absent."""
    emu, kubeconfig, helm = cluster  # noqa: F811
    s = spec()
    (emu ** 1)[kmock.action.WATCH, kmock.resource("kubeflow.org/v2beta1/mpijobs")] << 410

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        await set_conditions(emu, name, "Created")
        await asyncio.sleep(2.0)  # longer than no_status_s
        pod = add_pod(emu, name, "launcher", "Running")
        await set_conditions(emu, name, "Created", "Running")
        await serve_log(emu, pod, launcher_log(s, 41.0), delay_s=0.01).task
        await set_conditions(emu, name, "Created", "Running", "Succeeded")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, no_status_s=1.0), s, tmp_path / "run")
    assert op.done() or not op.cancel(), record.get("error")
    assert record["status"] == "ok" and record["tokens_per_s"] == 41.0, record.get("error")


FORBIDDEN = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
             "message": 'pods is forbidden: User "bench-ci" cannot list resource "pods" in API group "" '
                        f'in the namespace "{NAMESPACE}"'}


async def test_a_403_names_the_permission_and_fails_at_once(cluster, tmp_path):  # noqa: F811
    """The user may install but not list pods: a retry never helps, and "(403)" alone says nothing."""
    emu, kubeconfig, helm = cluster  # noqa: F811
    s = spec()

    async def operator():
        name = (await wait_for_mpijob(emu))["metadata"]["name"]
        (emu ** 1)[kmock.action.LIST, kmock.resource("v1/pods")] << 403 << FORBIDDEN
        await set_conditions(emu, name, "Created")

    op = asyncio.create_task(operator())
    record, _ = await run_in_thread(backend(kubeconfig, helm, start_timeout_s=60), s, tmp_path / "run")
    await op
    assert record["status"] == "failed"
    assert 'cannot list resource "pods"' in record["error"] and f"namespace {NAMESPACE}" in record["error"]
    assert "kubectl auth can-i" in record["error"]


def test_a_404_names_the_namespace():
    from kubernetes.client.rest import ApiException

    exc = ApiException(status=404, reason="Not Found")
    exc.body = json.dumps({"kind": "Status", "code": 404, "message": 'namespaces "bench-x" not found'})
    line = kapi.short(exc, "bench-x")
    assert line.startswith("HTTP 404 Not Found: namespaces \"bench-x\" not found") and "kubectl get namespace bench-x" in line
    assert "\n" not in line
