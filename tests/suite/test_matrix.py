"""Matrix expansion: unique ids, trainer flags, and one clear line per invalid combination,
checked with the trainer's own rules (trainer.rules.validate)."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from shardbench.trainer import contract
from shardbench.trainer.config import parse_args
from shardbench.suite.matrix.expand import (DEFAULT_MATRIX, MatrixSpec, expand, load_matrix, matrix_from_dict,
                              run_count, save_matrix)


@pytest.fixture(autouse=True)
def shapes(tmp_path, monkeypatch):
    """Shapes of known content (the real values/ files may change their numbers)."""
    for name, gpus, peak, usd in (("gpu8", 8, 989, 2.98), ("gpu2", 2, 125, 0.75), ("cpu", 0, None, None)):
        (tmp_path / f"{name}.yaml").write_text(
            f"shape:\n  name: {name}\n  gpusPerNode: {gpus}\n  peakTflopsBf16: {peak or 'null'}\n"
            f"  usdPerGpuHour: {usd or 'null'}\n")
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(tmp_path))


def test_expand_ids_order_and_trainer_args(tmp_path):
    m = MatrixSpec(strategies=["zero3", "ddp"], world_sizes=[1, 4], seq_lens=[128], micro_batch=1,
                   global_batch=8, repeats=2, shape="gpu8", model="gpt2-124m", device="cuda", backend="kubernetes")
    specs, errors = expand(m)
    assert errors == []
    assert [int(s.run_id.rsplit("-r", 1)[1]) for s in specs[:4]] == [0, 1, 0, 1]
    assert [s.run_id.rsplit("-", 2)[0] for s in specs[:4]] == ["zero3-w1-s128-mb1-ga8"] * 2 + ["zero3-w4-s128-mb1-ga2"] * 2
    assert specs[0].config_id == specs[1].config_id != specs[2].config_id
    assert {s.launcher for s in specs if s.strategy == "ddp"} == {"mpirun"}
    assert all(s.global_batch == 8 for s in specs)
    args = specs[3].trainer_args(output_dir=tmp_path)
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--strategy"] == "zero3" and pairs["--grad-accum"] == "2" and pairs["--seq-len"] == "128"
    assert pairs["--run-id"] == specs[3].run_id and pairs["--shape"] == "gpu8" and pairs["--repeat"] == "1"
    assert pairs["--peak-tflops"] == "989" and pairs["--usd-per-gpu-hour"] == "2.98"
    assert pairs["--output-dir"] == str(tmp_path)


def test_trainer_args_parse_back_into_the_config_the_id_was_made_from(tmp_path):
    """The suite's config id is the one the trainer computes from the flags it is given."""
    m = MatrixSpec(strategies=["fsdp"], world_sizes=[2], overrides={"activation_checkpointing": True,
                                                                  "lr": 3e-4})
    (spec,), errors = expand(m)
    assert errors == []
    cfg = parse_args(spec.trainer_args(tmp_path))
    from shardbench.trainer.config import id_fields

    assert cfg.activation_checkpointing is True and cfg.lr == 3e-4
    assert contract.config_id(id_fields(cfg, 2, 1, spec.launcher)) == spec.config_id


@pytest.mark.parametrize("change", [
    {"launcher": "deepspeed"}, {"model": "gpt2-124m"}, {"precision": "bf16"}, {"steps": 11},
    {"seed": 7}, {"overrides": {"lr": 1e-3}}, {"overrides": {"activation_checkpointing": True}},
    {"device": "cuda"}, {"shape": "gpu8"},
])
def test_runs_that_measure_different_things_never_share_an_id(change):
    base = dict(strategies=["ddp"], world_sizes=[1], seq_lens=[64], backend="kubernetes")
    (one,), _ = expand(MatrixSpec(**base))
    (two,), errors = expand(MatrixSpec(**base, **change))
    assert errors == [] and one.run_id != two.run_id


def test_a_new_timeout_or_results_dir_keeps_the_id():
    base = dict(strategies=["ddp"], world_sizes=[1], seq_lens=[64])
    (one,), _ = expand(MatrixSpec(**base))
    (two,), _ = expand(MatrixSpec(**base, timeout_s=5, results="elsewhere"))
    assert one.run_id == two.run_id


def test_any_trainer_knob_sweeps_as_an_axis():
    m = matrix_from_dict({"strategies": ["ddp"], "world_sizes": [1], "activation_checkpointing": [False, True]})
    specs, errors = expand(m)
    assert errors == [] and len(specs) == 2 == run_count(m)
    assert [s.config.activation_checkpointing for s in specs] == [False, True]
    assert [dict(s.extra_knobs) for s in specs] == [{}, {"activation_checkpointing": True}]  # knobs off their default
    assert "--activation-checkpointing" in specs[1].trainer_args()


@pytest.mark.parametrize("change, message", [
    ({"strategies": ["ddp", "zero4"]}, "strategy got 'zero4': use one of ddp, fsdp, zero1, zero2, zero3"),
    ({"launcher": "srun"}, "launcher got 'srun'"),
    ({"model": "gpt5"}, "model got 'gpt5'"),
    ({"model": [["tiny"]]}, "model got ['tiny']"),  # a list sweeps any knob; its values are checked
    ({"precision": "fp8"}, "precision got 'fp8'"),
    ({"seed": "abc"}, "seed must be an integer, got 'abc'"),
    ({"seq_lens": [64, 512]}, "seq_len 512 exceeds the tiny preset's block size 256"),
    ({"global_batch": 6, "world_sizes": [1, 4]}, "global_batch 6 is not a multiple of micro_batch 4 x world size 4 = 16"),
    ({"world_sizes": [2, 100000]}, "world size 100000 is larger than allowed"),
    ({"world_sizes": ["2"]}, "world_sizes must hold integers"),
    ({"shape": "tpu9"}, "unknown shape 'tpu9'"),
    ({"warmup_steps": 10, "steps": 10}, "warmup_steps 10 leaves no measured step out of steps 10"),
    ({"backend": "slurm"}, "backend got 'slurm'"),
    ({"backend": "kubernetes", "launcher": "torchrun"}, "launcher torchrun cannot run on the kubernetes backend"),
    ({"precision": "fp16", "device": "cpu"}, "precision fp16 needs a CUDA GPU"),
    ({"repeats": 0}, "repeats must be a positive integer"),
    ({"timeout_s": float("nan")}, "timeout_s must be a positive number"),
    ({"overrides": {"lr": float("inf")}}, "lr must be a finite number, got inf"),
])
def test_invalid_values_are_reported_one_line_each(change, message):
    specs, errors = expand(MatrixSpec(**change))
    assert specs == []
    assert any(message in e for e in errors), errors
    assert all("\n" not in e for e in errors)


def test_kubernetes_spans_nodes_in_whole_gpus_per_node():
    specs, errors = expand(MatrixSpec(backend="kubernetes", shape="gpu2", world_sizes=[2, 4], strategies=["ddp"]))
    assert errors == []
    assert [(s.nodes, s.procs_per_node) for s in specs] == [(1, 2), (2, 2)]
    _, errors = expand(MatrixSpec(backend="kubernetes", shape="gpu2", world_sizes=[3], strategies=["ddp"]))
    assert errors == ["world size 3 spans nodes of 2 GPUs (gpu2) but is not a multiple of 2"]


def test_yaml_round_trip_and_unknown_keys(tmp_path):
    m = MatrixSpec(strategies=["fsdp"], world_sizes=[2], repeats=3, overrides={"compile": True})
    path = tmp_path / "m.yaml"
    save_matrix(m, path)
    assert "compile: true" in path.read_text()  # a trainer knob is a top-level key
    assert load_matrix(path) == m
    path.write_text("strategy: [ddp]\n")
    with pytest.raises(ValueError, match="unknown matrix key.*strategy"):
        load_matrix(path)


def test_a_missing_matrix_file_is_one_line():
    with pytest.raises(ValueError, match=r"^cannot read matrix /no/such.yaml: No such file or directory$"):
        load_matrix("/no/such.yaml")


@pytest.mark.slow  # 200,000 specs: ~12 s idle
def test_large_matrices_need_a_yes_and_expand_linearly():
    m = MatrixSpec(strategies=["ddp"], world_sizes=[1], seq_lens=list(range(1, 201)), repeats=1000)
    started = time.monotonic()
    specs, errors = expand(m)
    assert specs == [] and errors == ["the matrix expands into 200,000 runs (more than 1,000): "
                                      "confirm with --yes, or sweep fewer values"]
    specs, errors = expand(m, limit=None)
    assert errors == [] and len(specs) == 200_000
    assert len({s.run_id for s in specs}) == 200_000
    # Quadratic expansion took over 120 s for this; linear is a few seconds even under load.
    assert time.monotonic() - started < 60


def test_default_matrix_is_every_strategy_at_1_and_2_with_repeats():
    m = load_matrix(DEFAULT_MATRIX)
    specs, errors = expand(m)
    assert errors == []
    assert {s.strategy for s in specs} == set(contract.STRATEGIES)
    assert {s.world_size for s in specs} == {1, 2} and {s.model for s in specs} == {"tiny"}
    assert m.repeats >= 3 and m.results == "results/default"


def test_matrix_import_stays_cheap():
    code = "import sys, shardbench.suite.matrix.expand, shardbench.suite.execute.events, shardbench.suite.backends.interface; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cli_rejects_bad_matrix_before_running(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--results", str(tmp_path / "r"),
                           "--strategies", "ddp,zero9", "--seq-lens", "999"], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines and all(line.startswith("shardbench: invalid matrix:") for line in lines), lines
    assert not (tmp_path / "r").exists()


def test_every_values_file_reads_as_a_shape():
    from pathlib import Path

    from shardbench.suite.matrix.expand import load_shape

    directory = Path(__file__).resolve().parents[2] / "values"
    files = sorted(directory.glob("*.yaml"))
    assert files, "values/ has no shape files"
    for path in files:
        shape = load_shape(path.stem, directory)
        assert shape.name == path.stem and isinstance(shape.gpus_per_node, int)
        assert shape.usd_per_gpu_hour is None or shape.usd_per_gpu_hour > 0


def test_a_gpu_shape_on_this_machine_without_a_gpu_is_refused(monkeypatch):
    import shardbench.suite.matrix.expand as matrix

    monkeypatch.setattr(matrix, "local_gpu_count", lambda: 0)  # what /proc/driver/nvidia says here
    specs, errors = expand(MatrixSpec(shape="gpu2", strategies=["ddp"], world_sizes=[1]))
    assert specs == [] and errors == ["shape gpu2 describes GPU nodes but this machine has no NVIDIA GPU: run it "
                                      "with --backend kubernetes, or locally with --shape cpu (or --shape none)"]
    monkeypatch.setattr(matrix, "local_gpu_count", lambda: 2)
    assert expand(MatrixSpec(shape="gpu2", strategies=["ddp"], world_sizes=[1]))[1] == []
    assert expand(MatrixSpec(shape="gpu2", strategies=["ddp"], world_sizes=[4], device="cuda"))[1] == [
        "world size 4 is larger than allowed (2: shape gpu2 has 2 GPUs per node)"]
    monkeypatch.setattr(matrix, "local_gpu_count", lambda: 0)
    assert expand(MatrixSpec(shape="cpu", strategies=["ddp"], world_sizes=[1]))[1] == []


def test_cluster_matrix_takes_model_precision_and_device_from_the_shape(tmp_path, monkeypatch):
    """`shardbench run --backend kubernetes --shape h100` used to inherit the CPU matrix (device
    cpu, fp32, tiny, seq 64), which the chart refuses."""
    (tmp_path / "h100.yaml").write_text(
        "shape:\n  name: h100\n  gpusPerNode: 8\n  peakTflopsBf16: 989\n  usdPerGpuHour: 2.98\n"
        "run:\n  model: gpt2-124m\n  seqLen: 1024\n  precision: bf16\n  device: cuda\n  steps: 40\n")
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(tmp_path))

    def dry_run(*flags):
        proc = subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--backend", "kubernetes",
                               "--shape", "h100", "--strategies", "ddp", "--world-sizes", "8", "--repeats", "1",
                               "--dry-run", *flags], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        args = proc.stdout.split()
        return dict(zip(args[2::2], args[3::2]))

    got = dry_run()
    assert (got["--model"], got["--seq-len"], got["--precision"], got["--device"], got["--steps"]) == (
        "gpt2-124m", "1024", "bf16", "cuda", "40")
    assert dry_run("--precision", "fp32")["--precision"] == "fp32"  # a flag still wins


def test_ray_cluster_is_a_matrix_setting_that_lays_ray_runs_out_on_the_cluster(tmp_path, monkeypatch):
    """Backend ray with ray_cluster runs KubeRay RayJobs: the matrix must treat it as a cluster
    (GPU shapes allowed on a CPU host, runs spanning the shape's nodes, its run defaults, only
    kill-rank) and not as this machine. It used to be a cluster flag the matrix never saw, so a
    GPU shape with backend ray was refused here."""
    (tmp_path / "h100.yaml").write_text(
        "shape:\n  name: h100\n  gpusPerNode: 8\n  peakTflopsBf16: 989\n"
        "run:\n  model: gpt2-124m\n  seqLen: 1024\n  precision: bf16\n  device: cuda\n  steps: 40\n")
    monkeypatch.setenv("SHARDBENCH_VALUES_DIR", str(tmp_path))
    import shardbench.suite.matrix.expand as matrix

    monkeypatch.setattr(matrix, "local_gpu_count", lambda: 0)
    ray = {"strategies": ["ddp"], "world_sizes": [16], "backend": "ray", "shape": "h100", "device": "cuda",
           "precision": "bf16"}
    specs, errors = expand(matrix_from_dict({**ray, "ray_cluster": True}))
    assert not errors and (specs[0].nodes, specs[0].procs_per_node, specs[0].launcher) == (2, 8, "ray")
    assert "no NVIDIA GPU" in expand(matrix_from_dict(ray))[1][0]  # an embedded Ray runs here
    _, errors = expand(matrix_from_dict({**ray, "ray_cluster": True, "faults": ["kill-rank:1@5", "stop-rank:1@5"]}))
    assert errors == ["fault stop-rank:1@5 cannot be injected on a cluster (kubernetes, or ray with ray_cluster: "
                      "it deletes a worker pod): use kill-rank:R@S there, or a local backend"]
    assert expand(matrix_from_dict({**ray, "backend": "local", "ray_cluster": True}))[1][0].startswith(
        "ray_cluster runs backend ray as KubeRay RayJobs; backend local ignores it")
    assert "ray_cluster must be true or false, got 'yes'" in expand(matrix_from_dict({**ray, "ray_cluster": "yes"}))[1]

    def dry_run(*flags):
        return subprocess.run([sys.executable, "-m", "shardbench.suite.cli", "run", "--backend", "ray", "--shape",
                               "h100", "--strategies", "ddp", "--world-sizes", "16", "--repeats", "1", "--dry-run",
                               *flags], capture_output=True, text=True)

    proc = dry_run("--ray-cluster")  # the flag is generated from MatrixSpec, like every matrix key
    assert proc.returncode == 0, proc.stderr
    args = proc.stdout.split()
    assert dict(zip(args[2::2], args[3::2]))["--device"] == "cuda"  # the shape's run defaults, as on kubernetes
    refused = dry_run()
    assert refused.returncode == 2 and "no NVIDIA GPU" in refused.stderr and len(refused.stderr.splitlines()) == 1
    (tmp_path / "m.yaml").write_text("backend: ray\nray_cluster: true\nshape: h100\nstrategies: [ddp]\n")
    assert load_matrix(tmp_path / "m.yaml").ray_cluster is True
