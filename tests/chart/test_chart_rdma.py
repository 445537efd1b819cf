"""Every values file x every rdma mode renders, lints (helm 3 and helm 4) and validates against the
vendored MPIJob CRD and the core schema; what each RDMA mode needs to register memory (root +
IPC_LOCK, as OCI's RDMA MPIJobs run) and to find its NICs (NCCL_IB_HCA and VF count per mode)."""
from __future__ import annotations

import pytest
from kubernetes_validate import ValidationError

from chart_helpers import (CHART, HELMS, RDMA_MODES, VALUES_FILES, core_validate, helm_cmd,
                           kube_versions_in_range, mpijob_errors, one, render, replica_pods)

# What a mode needs besides its name, when a values file does not give it (sriov: a VF
# resource; cpu/a10 name no Multus network).
EXTRA = {"sriov": ("rdma.resourceName=nvidia.com/rdma-vf",)}


def _sets(values: str, mode: str) -> tuple[str, ...]:
    sets = (f"rdma.mode={mode}", "workers=2", *EXTRA.get(mode, ()))
    if mode == "sriov" and values in ("cpu.yaml", "a10.yaml"):
        sets += ("rdma.networks=rdma-vf\\,rdma-vf",)
    return sets


MATRIX = [(v, m) for v in VALUES_FILES for m in RDMA_MODES]
IDS = [f"{v[:-5]}-{m}" for v, m in MATRIX]


@pytest.mark.parametrize("helm", sorted(HELMS))
@pytest.mark.parametrize("values,mode", MATRIX, ids=IDS)
def test_every_values_file_and_mode_lints_renders_and_validates(helm, values, mode):
    sets = _sets(values, mode)
    args = [a for s in sets for a in ("--set", s)]
    lint = helm_cmd(helm, "lint", "--strict", str(CHART), "-f", str(CHART.parent / "values" / values), *args)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(helm, (values,), sets)
    job = one(docs, "MPIJob")
    assert mpijob_errors(job) == []
    newest = kube_versions_in_range()[-1]
    for obj in [d for d in docs if d["kind"] != "MPIJob"] + list(replica_pods(job).values()):
        try:
            core_validate(obj, newest)
        except ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")


def _job(values: str, mode: str, *more: str) -> dict:
    return one(render("helm3", (values,), (*_sets(values, mode), *more)), "MPIJob")


def _worker(job: dict) -> tuple[dict, dict]:
    spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    return spec, spec["containers"][0]


def _env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container["env"]}


@pytest.mark.parametrize("mode", [m for m in RDMA_MODES if m != "none"])
def test_rdma_modes_run_as_root_with_ipc_lock(mode):
    job = _job("h100.yaml", mode)
    pod, worker = _worker(job)
    sc = worker["securityContext"]
    # ibv_reg_mr needs CAP_IPC_LOCK (or an unlimited memlock limit); only root can use an added one.
    assert sc["capabilities"]["add"] == ["IPC_LOCK"]
    assert (sc["runAsUser"], sc["runAsNonRoot"], pod["securityContext"]["runAsUser"]) == (0, False, 0)
    # mpirun logs in as root: the operator's keys in root's home, sshd admitting root by key.
    assert job["spec"]["sshAuthMountPath"] == "/root/.ssh"
    assert worker["command"][-4:] == ["-o", "PermitRootLogin=prohibit-password", "-o", "HostKey=/root/.ssh/id_rsa"]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["securityContext"]["runAsUser"] == 0 and "add" not in launcher["securityContext"]["capabilities"]


def test_no_rdma_stays_non_root_and_runasroot_false_keeps_the_user():
    for job in (_job("h100.yaml", "none"), _job("h100.yaml", "sriov", "rdma.runAsRoot=false")):
        _, worker = _worker(job)
        sc = worker["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}
        assert job["spec"]["sshAuthMountPath"] == "/home/mpiuser/.ssh"
        assert "PermitRootLogin=prohibit-password" not in worker["command"]


@pytest.mark.parametrize("values", ["a100.yaml", "h100.yaml", "h200.yaml"])
def test_sriov_selects_its_vfs_by_prefix_and_requests_one_per_nic(values):
    """The host's exact NIC list matches no VF name inside an SR-IOV pod (NCCL would fall back to
    sockets), and one VF per worker is not the shape's fabric."""
    host = _job(values, "host-network")
    sriov = _job(values, "sriov")
    _, hw = _worker(host)
    _, sw = _worker(sriov)
    assert _env(hw)["NCCL_IB_HCA"].startswith("=mlx5_")
    assert _env(sw)["NCCL_IB_HCA"] == "mlx5"
    nics = len(_env(hw)["NCCL_IB_HCA"].lstrip("=").split(","))
    assert sw["resources"]["limits"]["nvidia.com/rdma-vf"] == nics  # OCI: one VF per RDMA NIC
    annotations = sriov["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
    assert annotations["k8s.v1.cni.cncf.io/networks"].split(",") == ["rdma-vf"] * nics
    # The value reaches every rank: the launch command forwards it.
    args = " ".join(sriov["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"])
    assert "-x NCCL_IB_HCA" in args


def test_nccl_ib_hca_set_by_hand_wins():
    _, worker = _worker(_job("h100.yaml", "sriov", "nccl.NCCL_IB_HCA=mlx5_18"))
    assert _env(worker)["NCCL_IB_HCA"] == "mlx5_18"


# --- issue 34 --------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode,resource,other", [("sriov", "nvidia.com/rdma-vf", "rdma/rdma_shared_device_a"),
                                                 ("shared-device", "rdma/rdma_shared_device_a", "nvidia.com/rdma-vf")])
def test_each_device_mode_requests_its_own_resource(mode, resource, other):
    """Before: one rdma.resourceName defaulting to the shared device plugin's, so sriov asked for
    the shared device instead of VFs."""
    sets = ("rdma.mode=" + mode, "workers=2") + (("rdma.networks=rdma-vf\\,rdma-vf",) if mode == "sriov" else ())
    _, worker = _worker(one(render("helm3", ("h100.yaml",), sets), "MPIJob"))
    assert resource in worker["resources"]["limits"] and other not in worker["resources"]["limits"]
    assert worker["resources"]["requests"][resource] == worker["resources"]["limits"][resource]
    # rdma.resourceName still overrides the mode's entry.
    _, named = _worker(one(render("helm3", ("h100.yaml",), (*sets, "rdma.resourceName=example.com/rdma")), "MPIJob"))
    assert "example.com/rdma" in named["resources"]["limits"] and resource not in named["resources"]["limits"]


@pytest.mark.parametrize("mode", [m for m in RDMA_MODES if m != "none"])
def test_the_root_launcher_drops_every_capability(mode):
    """It only runs mpirun and ssh: root needs no capability for either (it owns its keys)."""
    launcher = _job("h100.yaml", mode)["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    sc = launcher["securityContext"]
    assert sc["runAsUser"] == 0 and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False


def test_the_readme_creates_every_namespace_it_labels():
    import re

    text = (CHART / "README.md").read_text()
    for m in re.finditer(r"kubectl label (?:ns|namespace) (\S+)", text):
        created = re.search(rf"kubectl create (?:ns|namespace) {re.escape(m.group(1))}\b", text[:m.start()])
        assert created, f"chart/README.md labels namespace {m.group(1)} without creating it first"
