"""Matrix expansion: stable ids, trainer flags, and one clear line per invalid combination."""
from __future__ import annotations

import subprocess
import sys

import pytest

from tui.suite.cli import DEFAULT_MATRIX
from tui.suite.matrix import MatrixSpec, expand, load_matrix, save_matrix
from tui.suite.presets import load_presets


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
                   global_batch=8, repeats=2, shape="gpu8", model="gpt2-124m", device="cuda")
    specs, errors = expand(m)
    assert errors == []
    assert [s.run_id for s in specs][:4] == ["zero3-w1-s128-mb1-ga8-r0", "zero3-w1-s128-mb1-ga8-r1",
                                            "zero3-w4-s128-mb1-ga2-r0", "zero3-w4-s128-mb1-ga2-r1"]
    assert {s.launcher for s in specs if s.strategy == "ddp"} == {"mpirun"}
    assert all(s.global_batch == 8 for s in specs)
    args = specs[2].trainer_args(output_dir=tmp_path)
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--strategy"] == "zero3" and pairs["--grad-accum"] == "2" and pairs["--seq-len"] == "128"
    assert pairs["--run-id"] == "zero3-w4-s128-mb1-ga2-r0" and pairs["--shape"] == "gpu8"
    assert pairs["--peak-tflops"] == "989" and pairs["--usd-per-gpu-hour"] == "2.98"
    assert pairs["--output-dir"] == str(tmp_path)


@pytest.mark.parametrize("change, message", [
    ({"strategies": ["ddp", "zero4"]}, "unknown strategy 'zero4'"),
    ({"launcher": "srun"}, "unknown launcher 'srun'"),
    ({"model": "gpt5"}, "unknown model preset 'gpt5'"),
    ({"precision": "fp8"}, "unknown precision 'fp8'"),
    ({"seq_lens": [64, 512]}, "seq len 512 is above the tiny preset's block size 256"),
    ({"global_batch": 6, "world_sizes": [1, 4]}, "global batch 6 is not a multiple of micro_batch 4 x world size 4 = 16"),
    ({"world_sizes": [2, 16]}, "world size 16 is larger than allowed"),
    ({"shape": "gpu2", "world_sizes": [4]}, "world size 4 is larger than allowed (2: shape gpu2 has 2 GPUs per node)"),
    ({"shape": "tpu9"}, "unknown shape 'tpu9'"),
    ({"warmup_steps": 10, "steps": 10}, "warmup_steps (10) must be below steps (10)"),
    ({"backend": "slurm"}, "unknown backend 'slurm'"),
])
def test_invalid_combinations_are_reported_one_line_each(change, message):
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
    m = MatrixSpec(strategies=["fsdp"], world_sizes=[2], repeats=3, extra_args=["--compile"])
    path = tmp_path / "m.yaml"
    save_matrix(m, path)
    assert load_matrix(path) == m
    path.write_text("strategy: [ddp]\n")
    with pytest.raises(ValueError, match="unknown matrix key.*strategy"):
        load_matrix(path)


def test_default_matrix_is_every_strategy_at_1_and_2_on_tiny():
    m = load_matrix(DEFAULT_MATRIX)
    specs, errors = expand(m)
    assert errors == []
    assert {s.strategy for s in specs} >= {"ddp", "fsdp", "zero2", "zero3"}
    assert {s.world_size for s in specs} == {1, 2} and {s.model for s in specs} == {"tiny"}


def test_presets_read_from_source_match_the_trainers_table():
    from trainer.model import PRESETS  # imports torch: the check that the cheap reader is right

    table = load_presets()
    assert set(table) == set(PRESETS)
    assert all(table[k]["block_size"] == PRESETS[k].block_size for k in PRESETS)


def test_matrix_import_stays_cheap():
    code = "import sys, tui.suite.matrix, tui.suite.events, tui.suite.backends.base; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_cli_rejects_bad_matrix_before_running(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tui.suite.cli", "run", "--results", str(tmp_path / "r"),
                           "--strategies", "ddp,zero9", "--seq-lens", "999"], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("shardbench: invalid matrix:") for line in lines)
    assert not (tmp_path / "r").exists()


def test_every_values_file_reads_as_a_shape():
    from pathlib import Path

    from tui.suite.matrix import load_shape

    directory = Path(__file__).resolve().parents[2] / "values"
    files = sorted(directory.glob("*.yaml"))
    assert files, "values/ has no shape files"
    for path in files:
        shape = load_shape(path.stem, directory)
        assert shape.name == path.stem and isinstance(shape.gpus_per_node, int)
        assert shape.usd_per_gpu_hour is None or shape.usd_per_gpu_hour > 0
