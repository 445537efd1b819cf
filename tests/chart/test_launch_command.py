"""The launcher command the chart renders is trainer.launchers.build_command() for the same run,
with the trainer arguments of shardbench.suite.matrix.expand.RunSpec.trainer_args(): one source of truth for
every flag, whether a run starts on this machine or as an MPIJob."""
from __future__ import annotations

import copy
import json

import pytest
import yaml

from chart_helpers import (CHART, CHART_LAUNCHERS, NAMESPACE, RELEASE, STRATEGIES, VALUES_DIR,
                           VALUES_FILES, launcher_argv, one, render)
from shardbench.trainer.contract import is_deepspeed
from shardbench.trainer.launchers import CONTAINER_ENV_VARS, LaunchPlan, build_command
from shardbench.suite.matrix.expand import RunSpec, load_shape

JOB = f"{RELEASE}-shardbench"



def _merge(base: dict, extra: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _sets(overrides: dict, prefix: str = "") -> list[str]:
    """--set strings for nested overrides (lists as name[i]=value)."""
    out = []
    for key, value in overrides.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _sets(value, name + ".")
        elif isinstance(value, list):
            out += [f"{name}[{i}]={v}" for i, v in enumerate(value)]
        else:
            out.append(f"{name}={value}")
    return out


def expected_command(values_file: str | None, overrides: dict) -> list[str]:
    """What the local backend would run for this run, built only from the Python side."""
    v = yaml.safe_load((CHART / "values.yaml").read_text())
    if values_file:
        v = _merge(v, yaml.safe_load((VALUES_DIR / values_file).read_text()))
    v = _merge(v, overrides)
    r, workers, gpw = v["run"], v["workers"], v["gpusPerWorker"]
    world = workers * gpw
    ga = r["globalBatch"] // (r["microBatch"] * world) if r.get("globalBatch") else r["gradAccum"]
    shape = load_shape(values_file[:-5]) if values_file else None  # the suite's reading of values/
    # No run.id: the trainer names the run itself (with the config hash only it computes).
    rid = r["id"] or ""
    extra = list(r["extraArgs"])
    if v["deepspeed"]["config"] and is_deepspeed(r["strategy"]):
        extra += ["--deepspeed-config", "/etc/shardbench/deepspeed.json"]
    spec = RunSpec(
        run_id=rid, strategy=r["strategy"], world_size=world, seq_len=r["seqLen"],
        micro_batch=r["microBatch"], grad_accum=ga, model=r["model"], precision=r["precision"],
        steps=r["steps"], warmup_steps=r["warmupSteps"], repeat=0, launcher=v["launcher"],
        backend="kubernetes", shape=v["shape"]["name"], nodes=workers, procs_per_node=gpw,
        device=r["device"], seed=r["seed"],
        peak_tflops=shape.peak_tflops if shape else v["shape"]["peakTflopsBf16"],
        usd_per_gpu_hour=shape.usd_per_gpu_hour if shape else v["shape"]["usdPerGpuHour"],
    )
    out_dir = f"{v['persistence']['mountPath']}/{rid or RELEASE}" if v["persistence"]["enabled"] else None
    # run.extraArgs go last, as given (the suite puts RunSpec.option_args() there).
    plan = LaunchPlan(
        launcher=v["launcher"], nodes=workers, procs_per_node=gpw,
        trainer_args=spec.trainer_args(out_dir) + extra, hostfile="/etc/mpi/hostfile",
        master_addr=f"{JOB}-worker-0.{JOB}.{NAMESPACE}.svc", master_port=v["masterPort"],
        # The chart forwards the container's variables and every nccl:/env: key to every rank.
        # NCCL_IB_HCA comes from rdma.hca for the mode when nccl: does not set it (_rdma.tpl).
        forward_env=[*CONTAINER_ENV_VARS, *v["nccl"], *v["env"],
                     *(["NCCL_IB_HCA"] if (v["rdma"].get("hca") or {}).get(v["rdma"]["mode"]) else [])],
        tcp_if_include=v["tcpIfInclude"] or None,
        numa_bind=v["numaBind"], numa_nodes=v["shape"]["numaNodes"],
    )
    return build_command(plan)


CASES = [(f, {}) for f in VALUES_FILES] + [
    ("h100.yaml", {"run": {"strategy": s}, "launcher": l, "workers": 2})
    for s in STRATEGIES for l in CHART_LAUNCHERS
] + [
    ("a10.yaml", {"launcher": "mpirun", "workers": 3, "nccl": {"NCCL_DEBUG": "INFO"}, "env": {"OMP_NUM_THREADS": 4}}),
    ("cpu.yaml", {"persistence": {"enabled": "true"}, "run": {"extraArgs": ["--activation-checkpointing", "--compile"]}}),
    ("a100.yaml", {"workers": 2, "run": {"microBatch": 2, "globalBatch": 256, "id": "my-run"}}),
    ("h200.yaml", {"run": {"strategy": "zero3"}, "deepspeed": {"config": {"zero_optimization": {"stage": 3}}}}),
    ("h100.yaml", {"launcher": "deepspeed", "tcpIfInclude": "eth0", "workers": 2}),
    ("h100.yaml", {"launcher": "mpirun", "tcpIfInclude": "ens300f0"}),
    (None, {}),
]


@pytest.mark.parametrize("values_file,overrides", CASES,
                         ids=[f"{f}-{json.dumps(o, sort_keys=True)}" for f, o in CASES])
def test_chart_command_is_build_command(values_file, overrides):
    docs = render("helm3", (values_file,) if values_file else (), tuple(_sets(overrides)))
    job = one(docs, "MPIJob")
    rendered = launcher_argv(job)
    expected = expected_command(values_file, overrides)
    assert rendered == expected
    cm = one(docs, "ConfigMap")["data"]
    assert json.loads(cm["launch-command.json"]) == expected
    trainer_args = expected[expected.index("shardbench.trainer") + 1:]
    assert trainer_args[-2:] == ["--launcher", job["metadata"]["labels"]["shardbench.io/launcher"]]
    assert json.loads(cm["trainer-args.json"]) == trainer_args
    run_id = trainer_args[trainer_args.index("--run-id") + 1] if "--run-id" in trainer_args else None
    assert cm["run-name"] == (run_id or RELEASE)


def test_helm4_renders_the_same_command():
    for values_file in VALUES_FILES:
        for launcher in CHART_LAUNCHERS:
            sets = (f"launcher={launcher}", "workers=2")
            cmds = [launcher_argv(one(render(h, (values_file,), sets), "MPIJob")) for h in ("helm3", "helm4")]
            assert cmds[0] == cmds[1]


def test_the_comparison_can_fail():
    """A run that differs in one flag gives a different command (the test is not vacuous)."""
    assert expected_command("h100.yaml", {}) != expected_command("h100.yaml", {"run": {"seqLen": 1024}})
    rendered = launcher_argv(one(render("helm3", ("h100.yaml",)), "MPIJob"))
    assert rendered != expected_command("h100.yaml", {"masterPort": 29501})
