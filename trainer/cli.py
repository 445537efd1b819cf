"""`python -m trainer`: check the arguments, run, and report exactly one result record.
A run ends with os._exit (see _exit_now): main returns only for a bad argument.

Exit codes: 0 ok; 2 a bad argument (one line on stderr, before any process group starts);
1 the run failed (rank 0 still prints a record with status failed or oom and the error).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
import traceback
from typing import NoReturn

from trainer import contract
from trainer.config import ConfigError, RunConfig, parse_args
from trainer.dist_env import detect
from trainer.record import emit, write_atomic


class Terminated(Exception):
    """SIGTERM/SIGINT arrived (a timeout or a cancel): report what was measured, then stop."""


def _on_signal(signum, _frame):
    raise Terminated(f"terminated by signal {signal.Signals(signum).name}")


def check(cfg: RunConfig, world_size: int) -> None:
    """The contract's rules, then DeepSpeed installed where needed (memory that must fit is
    checked by trainer.devices once the device is known)."""
    errors = contract.validate(cfg, world_size)
    if errors:
        raise ConfigError(errors[0])
    if contract.is_deepspeed(cfg.strategy) and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"--strategy {cfg.strategy} needs DeepSpeed, which is not installed: "
                          "run scripts/bootstrap.sh (or pip install deepspeed after torch)")


def classify(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    # CUDA: OutOfMemoryError ("CUDA out of memory"); CPU allocator: "can't allocate memory".
    markers = ("out of memory", "outofmemory", "can't allocate memory", "cannot allocate memory")
    if isinstance(exc, MemoryError) or any(m in text for m in markers):
        return "oom"
    return "failed"


def describe(exc: BaseException) -> str:
    """One line saying what happened, then the last frames of where."""
    first = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    tail = "".join(traceback.format_exception(exc)[-6:])
    return f"{first}\n{tail}"


def main(argv: list[str] | None = None) -> int:
    process_start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    cfg = parse_args(argv)
    denv = detect()
    try:
        check(cfg, denv.world_size)
        from trainer.env_info import process_start_time
        from trainer.train import Trainer  # torch is imported only after the cheap checks

        trainer = Trainer(cfg, denv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    process_start = min(process_start, process_start_time())
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    try:
        trainer.init_process_group()
        trainer.build()
        trainer.train(process_start)
        record = trainer.finish(process_start)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        record = trainer.record
        trainer.fill_timings(record)
        record.status = classify(exc)
        record.error = describe(exc)
        print(f"rank {denv.rank}: {record.status}: {record.error}", file=sys.stderr, flush=True)
        _report(record, cfg, denv.rank)
        # A broken process group can hang in its destructors: skip them.
        _exit_now(1)
    _report(record, cfg, denv.rank)
    _shutdown()
    # Even a clean group can abort in interpreter teardown: gloo's C++ threads are destroyed
    # after Python is gone ("terminate called without an active exception", about 1 run in 12
    # at world size 2 on this 2-core machine). Everything is reported by now, so skip it.
    _exit_now(0)


def _report(record, cfg: RunConfig, rank: int) -> None:
    if rank != 0:
        return
    emit(record)
    if cfg.output_dir:
        write_atomic(record, os.path.join(cfg.output_dir, "result.json"))


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _exit_now(code: int) -> NoReturn:
    """Flush, finalize MPI if the rendezvous started it (prterun counts a rank that skips
    MPI_Finalize as failed), and leave without running C++ static destructors."""
    sys.stdout.flush()
    sys.stderr.flush()
    mpi = sys.modules.get("mpi4py.MPI")
    if code == 0 and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)
