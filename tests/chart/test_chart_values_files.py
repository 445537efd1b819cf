"""values/<shape>.yaml: the shape block the suite reads (docs/CONTRACTS.md), the right hardware
figures for each shape, NCCL/RDMA settings as the shape needs them, and a recommended run."""
from __future__ import annotations

import json

import pytest
import yaml
from jsonschema import Draft7Validator

from chart_helpers import CHART, VALUES_DIR, VALUES_FILES
from shardbench.suite.matrix.expand import load_shape
from shardbench.trainer.presets import PRESETS

SHAPE_KEYS = ["name", "instanceType", "gpuModel", "gpusPerNode", "gpuMemoryGiB", "peakTflopsBf16",
              "usdPerGpuHour"]
# Dense bf16 peak of one device, TFLOP/s (docs: A10 125, A100 312, H100 SXM 989, H200 989).
EXPECTED = {
    "a10": dict(peak=125, instance="VM.GPU.A10.", gpu="A10", memory=24),
    "a100": dict(peak=312, instance="BM.GPU4.8", gpu="A100", memory=40),
    "h100": dict(peak=989, instance="BM.GPU.H100.8", gpu="H100", memory=80),
    "h200": dict(peak=989, instance="BM.GPU.H200.8", gpu="H200", memory=141),
}
RDMA_SHAPES = ("a100", "h100", "h200")
# The oracle-quickstart/oci-hpc-oke commit whose manifests the RDMA values files cite.
OCI_COMMIT = "61d210acc37f1990f27012aa4f108c5db4e52ab2"


def load(name: str) -> dict:
    return yaml.safe_load((VALUES_DIR / name).read_text())


@pytest.mark.parametrize("values", VALUES_FILES)
def test_values_file_matches_the_chart_schema(values):
    schema = json.loads((CHART / "values.schema.json").read_text())
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())

    def merge(a, b):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    errors = [e.message for e in Draft7Validator(schema).iter_errors(merge(defaults, load(values)))]
    assert errors == []


@pytest.mark.parametrize("values", VALUES_FILES)
def test_shape_block_follows_the_contract(values):
    shape = load(values)["shape"]
    assert list(shape) == SHAPE_KEYS
    name = values.removesuffix(".yaml")
    assert shape["name"] == name
    # What the suite reads out of it.
    suite = load_shape(name, VALUES_DIR)
    assert suite.gpus_per_node == shape["gpusPerNode"]
    assert suite.peak_tflops == (None if shape["peakTflopsBf16"] is None else float(shape["peakTflopsBf16"]))
    assert suite.usd_per_gpu_hour == (None if shape["usdPerGpuHour"] is None else float(shape["usdPerGpuHour"]))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gpu_shape_figures(name):
    v = load(f"{name}.yaml")
    shape, want = v["shape"], EXPECTED[name]
    assert shape["peakTflopsBf16"] == want["peak"]
    assert shape["instanceType"].startswith(want["instance"])
    # "A10" is a substring of "A100": compare words, not substrings.
    assert want["gpu"] in shape["gpuModel"].replace("-", " ").split()
    assert shape["gpuMemoryGiB"] == want["memory"]
    assert shape["gpusPerNode"] >= 1 and 0 < shape["usdPerGpuHour"] < 20
    assert v["gpuResource"] == "nvidia.com/gpu"
    assert 1 <= v["gpusPerWorker"] <= shape["gpusPerNode"]
    assert v["image"]["tag"].endswith("-cuda")
    assert v["run"]["device"] == "cuda"


def test_cpu_shape():
    v = load("cpu.yaml")
    assert v["shape"]["gpusPerNode"] == 0 and v["shape"]["peakTflopsBf16"] is None
    assert v["gpuResource"] == "" and v["run"]["device"] == "cpu"
    assert v["image"]["tag"].endswith("-cpu")


@pytest.mark.parametrize("values", VALUES_FILES)
def test_recommended_run(values):
    run = load(values)["run"]
    assert {"microBatch", "seqLen", "precision", "model"} <= set(run)
    assert run["seqLen"] <= PRESETS[run["model"]].block_size
    if values != "cpu.yaml":
        assert run["precision"] == "bf16"  # every one of these GPUs has bf16


def test_a10_uses_sockets():
    nccl = load("a10.yaml")["nccl"]
    assert nccl["NCCL_IB_DISABLE"] == "1"
    assert nccl["NCCL_P2P_LEVEL"] == "SYS"
    assert nccl["NCCL_ALGO"] == "Ring"
    assert nccl["NCCL_SOCKET_IFNAME"]
    assert load("a10.yaml")["rdma"]["mode"] == "none"


@pytest.mark.parametrize("name", RDMA_SHAPES)
def test_bare_metal_uses_rdma_and_nvlink(name):
    v = load(f"{name}.yaml")
    nccl = v["nccl"]
    text = (VALUES_DIR / f"{name}.yaml").read_text()
    # OCI's published list for the shape, named in a comment as the source.
    instance = v["shape"]["instanceType"]
    # Pinned to the commit read (the host-network/mpi-operator/ path cited before is gone from
    # main): the host-network manifest and the virtual-functions (SR-IOV) one.
    assert f"oci-hpc-oke/blob/{OCI_COMMIT}/manifests/nccl-tests/kueue/{instance}.yaml" in text
    assert f"oci-hpc-oke/blob/{OCI_COMMIT}/manifests/nccl-tests/kueue/virtual-functions/{instance}.yaml" in text
    assert "host-network/mpi-operator" not in text
    hca = v["rdma"]["hca"]
    assert "NCCL_IB_HCA" not in nccl  # per mode, from rdma.hca
    assert hca["host-network"].startswith("=mlx5_")  # exactly the RDMA NICs, not the front-end one
    assert hca["shared-device"] == hca["host-network"] and hca["sriov"] == "mlx5"
    assert (nccl["NCCL_IB_GID_INDEX"], nccl["NCCL_IB_TC"], nccl["NCCL_IB_SL"]) == ("3", "41", "0")
    assert nccl["NCCL_SOCKET_IFNAME"]
    if name in ("h100", "h200"):
        assert nccl["NCCL_CUMEM_ENABLE"] == "0" and nccl["NCCL_IGNORE_CPU_AFFINITY"] == "1"
    assert "NCCL_TOPO_FILE" in text  # documented, optional
    assert v["rdma"]["mode"] == "host-network"  # as OCI runs RDMA MPIJobs on these shapes
    assert v["numaBind"] is True
    assert v["oneWorkerPerNode"] is True
    assert v["gpusPerWorker"] == v["shape"]["gpusPerNode"]


@pytest.mark.parametrize("values", VALUES_FILES)
def test_every_nccl_value_is_a_string(values):
    # Environment values are strings; a YAML 0 rendered as "0" is fine, but keep them explicit.
    for key, value in (load(values).get("nccl") or {}).items():
        assert isinstance(value, str), f"{values}: {key} should be quoted"
