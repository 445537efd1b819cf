"""helm lint --strict and helm template, with helm 3 and helm 4, for every values file and every
strategy x launcher; and what the rendered MPIJob must say."""
from __future__ import annotations

import json

import pytest
import yaml

from chart_helpers import (CHART, CHART_LAUNCHERS, HELMS, NAMESPACE, RDMA_MODES, RDMA_SETS, RELEASE,
                           REPO, STRATEGIES, VALUES_DIR, VALUES_FILES, helm_cmd, launcher_argv, one,
                           render, replica_pods, template_error)
from shardbench.trainer.contract import is_deepspeed

COMBOS = [(s, l) for s in STRATEGIES for l in CHART_LAUNCHERS]


def test_every_shape_has_a_values_file():
    assert set(VALUES_FILES) == {"a10.yaml", "a100.yaml", "h100.yaml", "h200.yaml", "cpu.yaml"}


@pytest.mark.parametrize("helm", sorted(HELMS))
def test_helm_versions(helm):
    out = helm_cmd(helm, "version", "--short").stdout
    assert out.startswith({"helm3": "v3.", "helm4": "v4."}[helm]), out


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("values", [None, *VALUES_FILES])
def test_lint_strict(helm, values):
    args = ["lint", "--strict", str(CHART)] + (["-f", str(VALUES_DIR / values)] if values else [])
    proc = helm_cmd(helm, *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("mode", RDMA_MODES)
def test_lint_strict_rdma_mode(helm, mode):
    args = [a for s in RDMA_SETS[mode] for a in ("--set", s)]
    proc = helm_cmd(helm, "lint", "--strict", str(CHART), "-f", str(VALUES_DIR / "h100.yaml"), *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("strategy,launcher", COMBOS)
def test_lint_strict_strategy_launcher(helm, strategy, launcher):
    proc = helm_cmd(helm, "lint", "--strict", str(CHART), "-f", str(VALUES_DIR / "h100.yaml"),
                    "--set", f"run.strategy={strategy}", "--set", f"launcher={launcher}")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("strategy,launcher", COMBOS)
def test_template_strategy_launcher(helm, strategy, launcher):
    docs = render(helm, ("h100.yaml",), (f"run.strategy={strategy}", f"launcher={launcher}", "workers=2"))
    job = one(docs, "MPIJob")
    cmd = launcher_argv(job)
    assert cmd[0] == launcher
    assert cmd[cmd.index("--strategy") + 1] == strategy
    labels = job["metadata"]["labels"]
    assert labels["shardbench.io/strategy"] == strategy
    assert labels["shardbench.io/world-size"] == "16"


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("values", VALUES_FILES)
def test_mpijob_follows_values(helm, values):
    vals = yaml.safe_load((VALUES_DIR / values).read_text())
    docs = render(helm, (values,), ("workers=2",))
    job = one(docs, "MPIJob")
    spec = job["spec"]
    gpw = vals["gpusPerWorker"]
    assert job["apiVersion"] == "kubeflow.org/v2beta1"
    assert spec["slotsPerWorker"] == gpw
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["mpiImplementation"] == "OpenMPI"
    rdma = vals["rdma"]["mode"] != "none"  # root with IPC_LOCK (test_chart_rdma.py)
    assert spec["sshAuthMountPath"] == ("/root/.ssh" if rdma else "/home/mpiuser/.ssh")
    assert set(spec["runPolicy"]) == {"cleanPodPolicy", "backoffLimit", "activeDeadlineSeconds",
                                      "ttlSecondsAfterFinished"}
    assert spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    assert spec["mpiReplicaSpecs"]["Launcher"]["replicas"] == 1

    pods = replica_pods(job)
    launcher, worker = pods["Launcher"]["spec"], pods["Worker"]["spec"]
    gpu = vals.get("gpuResource")
    # The launcher is CPU-only: it never holds a GPU.
    for section in ("limits", "requests"):
        assert not any("gpu" in k for k in launcher["containers"][0]["resources"].get(section, {}))
        if gpu:
            assert worker["containers"][0]["resources"][section][gpu] == gpw
    shm = next(v for v in worker["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory" and shm["emptyDir"]["sizeLimit"] == vals["shmSize"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in worker["containers"][0]["volumeMounts"]

    host_net = vals["rdma"]["mode"] == "host-network"
    caps = worker["containers"][0]["securityContext"]["capabilities"]
    assert caps == ({"drop": ["NET_RAW"], "add": ["IPC_LOCK"]} if rdma else {"drop": ["ALL"]})
    for pod in (launcher, worker):
        ctx = pod["containers"][0]["securityContext"]
        assert (ctx["runAsUser"] == 0) if rdma else (ctx["runAsNonRoot"] and ctx["runAsUser"] >= 10000)
        assert ctx["allowPrivilegeEscalation"] is (host_net and pod is worker)
        assert pod["automountServiceAccountToken"] is False
        assert pod.get("hostNetwork", False) is host_net
    if vals.get("oneWorkerPerNode"):
        term = worker["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["topologyKey"] == "kubernetes.io/hostname"
    env = {e["name"]: e["value"] for e in worker["containers"][0]["env"]}
    for name, value in (vals.get("nccl") or {}).items():
        assert env[name] == str(value)

    labels = job["metadata"]["labels"]
    assert labels["shardbench.io/shape"] == vals["shape"]["name"]
    assert labels["shardbench.io/world-size"] == str(2 * gpw)
    assert labels["shardbench.io/seq-len"] == str(vals["run"]["seqLen"])
    assert labels["app.kubernetes.io/instance"] == RELEASE
    assert job["metadata"]["namespace"] == NAMESPACE


def test_helm_test_pod_is_a_hook_that_checks_the_record():
    for values in ("cpu.yaml", "h100.yaml"):
        pod = next(d for d in render("helm3", (values,)) if d["kind"] == "Pod")
        assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
        cmd = pod["spec"]["containers"][0]["command"]
        assert cmd[:2] == ["python", "/etc/shardbench/smoke_check.py"]
        assert cmd[cmd.index("--strategy") + 1] == "ddp"
        assert int(cmd[cmd.index("--steps") + 1]) <= 5
        device = cmd[cmd.index("--device") + 1]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert device == ("cuda" if values == "h100.yaml" else "cpu")
        assert limits.get("nvidia.com/gpu") == (1 if device == "cuda" else None)


def test_optional_objects():
    docs = render("helm3", ("a100.yaml",), ("persistence.enabled=true", "workers=2", "rdma.mode=none",
                                                 "persistence.accessModes={ReadWriteMany}"))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "MPIJob", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy",
                     "PersistentVolumeClaim", "Pod", "ServiceAccount"]
    job = one(docs, "MPIJob")
    worker = replica_pods(job)["Worker"]["spec"]
    claim = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == claim for v in worker["volumes"])
    cmd = launcher_argv(job)
    assert cmd[cmd.index("--output-dir") + 1].startswith("/results/")

    docs = render("helm3", (), ("networkPolicy.enabled=false", "serviceAccount.create=false",
                               "persistence.enabled=true", "persistence.existingClaim=mine"))
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "MPIJob", "Pod"]
    job = one(docs, "MPIJob")
    assert any(v.get("persistentVolumeClaim", {}).get("claimName") == "mine"
               for v in replica_pods(job)["Worker"]["spec"]["volumes"])


def test_network_policy_admits_only_this_jobs_pods():
    docs = render("helm3")
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    for component in ("launcher", "worker"):
        policy = policies[f"{RELEASE}-shardbench-{component}"]
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert policy["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == RELEASE
        exprs = {e["key"]: e["values"] for e in policy["ingress"][0]["from"][0]["podSelector"]["matchExpressions"]}
        assert exprs["app.kubernetes.io/instance"] == [RELEASE]
        assert sorted(exprs["app.kubernetes.io/component"]) == ["launcher", "worker"]
    assert policies[f"{RELEASE}-shardbench-smoke-test"]["ingress"] == []


def test_deepspeed_config_override_goes_through_the_configmap():
    docs = render("helm3", (), ("run.strategy=zero2", "deepspeed.config.zero_optimization.stage=2",
                               "deepspeed.config.zero_optimization.overlap_comm=true"))
    data = one(docs, "ConfigMap")["data"]
    merged = json.loads((REPO / "trainer" / "ds_configs" / "zero2.json").read_text())
    merged["zero_optimization"]["overlap_comm"] = True
    assert json.loads(data["deepspeed.json"]) == merged  # complete: the override merged over the packaged one
    launcher = replica_pods(one(docs, "MPIJob"))["Launcher"]["spec"]
    cmd = launcher["containers"][0]["args"]
    assert cmd[cmd.index("--deepspeed-config") + 1] == "/etc/shardbench/deepspeed.json"
    assert {"name": "config", "mountPath": "/etc/shardbench", "readOnly": True} in launcher["containers"][0]["volumeMounts"]


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if is_deepspeed(s)])
def test_chart_ds_configs_are_the_trainers(strategy):
    packaged = json.loads((REPO / "trainer" / "ds_configs" / f"{strategy}.json").read_text())
    assert json.loads((CHART / "files" / "ds_configs" / f"{strategy}.json").read_text()) == packaged, \
        "chart/files/ds_configs/ is a copy of trainer/ds_configs/: copy it again"
    docs = render("helm3", (), (f"run.strategy={strategy}",))
    assert json.loads(one(docs, "ConfigMap")["data"]["deepspeed.json"]) == packaged
    # Without an override the trainer reads its own copy: no flag, the same command as a local run.
    assert "--deepspeed-config" not in launcher_argv(one(docs, "MPIJob"))


def test_global_batch_sets_grad_accum():
    docs = render("helm3", ("h100.yaml",), ("workers=2", "run.microBatch=2", "run.globalBatch=128"))
    cmd = launcher_argv(one(docs, "MPIJob"))
    assert cmd[cmd.index("--grad-accum") + 1] == "4"  # 128 / (2 x 16)
    assert "--run-id" not in cmd  # the trainer names it, config hash included
    cmd = launcher_argv(one(render("helm3", ("h100.yaml",), ("run.id=my-run",)), "MPIJob"))
    assert cmd[cmd.index("--run-id") + 1] == "my-run"


@pytest.mark.parametrize("helm", sorted(HELMS))
def test_kube_version_range_is_enforced(helm):
    old = helm_cmd(helm, "template", RELEASE, str(CHART), "--kube-version", "1.27.3")
    assert old.returncode != 0 and "incompatible with Kubernetes v1.27.3" in old.stderr
    # Pre-release / vendor suffixes (EKS, GKE) still match thanks to the "-0" in the range.
    assert helm_cmd(helm, "template", RELEASE, str(CHART), "--kube-version", "1.31.2-eks-1").returncode == 0


def _worker_and_launcher(mode: str) -> tuple[dict, dict, list[dict]]:
    docs = render("helm3", ("h100.yaml",), ("workers=2", *RDMA_SETS[mode]))
    pods = replica_pods(one(docs, "MPIJob"))
    return pods["Worker"], pods["Launcher"], docs


@pytest.mark.parametrize("mode", RDMA_MODES)
def test_rdma_mode_renders_what_it_needs(mode):
    worker, launcher, docs = _worker_and_launcher(mode)
    w, l = worker["spec"], launcher["spec"]
    wc = w["containers"][0]
    limits = wc["resources"]["limits"]
    host_net = mode == "host-network"
    for spec in (w, l):  # launcher too: the daemons' callbacks come from node addresses
        assert spec.get("hostNetwork", False) is host_net
        assert (spec.get("dnsPolicy") == "ClusterFirstWithHostNet") is host_net
    assert wc["securityContext"]["privileged"] is host_net
    # The RDMA modes run as root with IPC_LOCK (tests/chart/test_chart_rdma.py), none as the user.
    assert wc["securityContext"]["runAsNonRoot"] is (mode == "none")
    devices = [v for v in w["volumes"] if v.get("hostPath", {}).get("path") == "/dev/infiniband"]
    assert bool(devices) is host_net
    assert ("rdma/rdma_shared_device_a" in limits) is (mode == "shared-device")
    assert limits.get("nvidia.com/rdma-vf") == (2 if mode == "sriov" else None)
    networks = worker["metadata"]["annotations"].get("k8s.v1.cni.cncf.io/networks")
    assert networks == ("rdma-vf,rdma-vf" if mode == "sriov" else None)
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"}
    # No NetworkPolicy applies to host-network pods: none is rendered that would pretend to.
    assert (f"{RELEASE}-shardbench-worker" in policies) is not host_net


def test_sriov_needs_its_network():
    proc = helm_cmd("helm3", "template", RELEASE, str(CHART), "-f", str(VALUES_DIR / "h100.yaml"),
                    "--set", "rdma.mode=sriov", "--set", "rdma.networks=")
    assert proc.returncode != 0 and "rdma.mode sriov needs rdma.networks" in proc.stderr


def test_gang_scheduling_and_launcher_placement():
    docs = render("helm3", ("h100.yaml",), ("workers=4", "gang.scheduler=volcano", "gang.queue=gpu",
                                             "gang.scheduleTimeoutSeconds=600", "gang.kueueQueue=team-a",
                                             "launcherPlacement.nodeSelector.pool=cpu"))
    job = one(docs, "MPIJob")
    policy = job["spec"]["runPolicy"]
    # minAvailable counts the workers only: the launcher is created after they are Ready.
    assert policy["schedulingPolicy"] == {"minAvailable": 4, "queue": "gpu", "scheduleTimeoutSeconds": 600}
    assert policy["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    pods = replica_pods(job)
    assert pods["Launcher"]["spec"]["nodeSelector"] == {"pool": "cpu"}
    assert pods["Worker"]["spec"]["nodeSelector"] == {"node.kubernetes.io/instance-type": "BM.GPU.H100.8"}
    assert "tolerations" not in pods["Launcher"]["spec"]  # the GPU taint toleration is the workers'
    plain = one(render("helm3", ("h100.yaml",)), "MPIJob")["spec"]["runPolicy"]
    assert "schedulingPolicy" not in plain and "suspend" not in plain


def test_launcher_can_pull_the_cpu_image():
    pods = replica_pods(one(render("helm3", ("h100.yaml",), ("image.launcherTag=0.1.0-cpu",)), "MPIJob"))
    assert pods["Launcher"]["spec"]["containers"][0]["image"] == "shardbench:0.1.0-cpu"
    assert pods["Worker"]["spec"]["containers"][0]["image"] == "shardbench:0.1.0-cuda"
    same = replica_pods(one(render("helm3", ("h100.yaml",)), "MPIJob"))
    assert same["Launcher"]["spec"]["containers"][0]["image"] == "shardbench:0.1.0-cuda"


@pytest.mark.parametrize("value", [".", "..", "-x", ".hidden"])
def test_run_id_and_attempt_must_be_safe_path_names(value):
    """run.id and checkpoint.attempt become directory names under /results: `.` and `..` would
    write a run's outputs into another's (or the volume's root); a leading `-` reads as a flag."""
    for key in ("run.id", "checkpoint.attempt"):
        err = template_error("helm3", ("h100.yaml",), (f"{key}={value}",))
        assert "values don't meet the specifications of the schema" in err and key.split(".")[-1] in err
