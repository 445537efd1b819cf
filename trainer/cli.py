"""`python -m shardbench.trainer`: check the arguments, run, and report exactly one result record.
A run ends with os._exit (see _exit_now): main returns only for a bad argument.

Exit codes: 0 ok; 2 a bad argument (one line on stderr, before any process group starts);
1 the run failed (rank 0 still prints a record with status failed or oom and the error).

Nothing measured is lost: rank 0 writes result.json before it prints the record (a closed
stdout cannot lose it), SIGTERM/SIGINT become a failed record, and every rank stops when its
launcher dies (trainer/lifeline.py).
"""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
import time
import traceback
from typing import NoReturn

from shardbench.trainer import contract, rules
from shardbench.trainer.fsprobe import probe_writable
from shardbench.trainer.config import ConfigError, RunConfig, parse_args
from shardbench.trainer.dist_env import detect
from shardbench.trainer.lifeline import (announce_rank0, close_peer_connections, failures_before, hold_for_rank0,
                                         leave_failure_note, tie_to_launcher)
from shardbench.trainer.record import START_STAMP, emit, write_atomic
from shardbench.trainer.streams import tolerate_closed_readers


class Terminated(Exception):
    """SIGTERM/SIGINT arrived (a timeout or a cancel): report what was measured, then stop."""


def _on_signal(signum, _frame):
    raise Terminated(f"terminated by signal {signal.Signals(signum).name}")


def check(cfg: RunConfig, world_size: int, rank: int = 0, denv=None) -> None:
    """The contract's rules, then DeepSpeed installed where needed (memory that must fit is
    checked by trainer.devices once the device is known)."""
    errors = rules.validate(cfg, world_size)
    if errors:
        raise ConfigError(errors[0])
    placement = rules.check_gpus_per_worker(cfg, denv.local_world_size) if denv is not None else None
    if placement:
        raise ConfigError(placement)
    if cfg.output_dir and rank == 0:
        probe_writable(cfg.output_dir, "--output-dir")
    if rank == 0 and denv is not None and (cfg.checkpoint_dir or cfg.resume not in ("auto", "never")):
        from shardbench.trainer.checkpoint_guard import prepare

        prepare(cfg, world_size, denv.local_world_size, denv.launcher)  # writable, locked, same settings
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


def _blame_earlier_failures(record, output_dir: str | None, since: float) -> None:
    """Rank 0's collective failed because another rank failed first (it shut its connections,
    trainer/lifeline.py): the record names that rank's failure and status (a SIGTERM, an OOM),
    then rank 0's own error."""
    earlier = failures_before(output_dir, since)
    if earlier:
        rank, status, line = earlier[0]
        record.error = f"rank {rank} failed first ({status}): {line}\nthen rank 0: {record.error}"
        if record.status == "failed" and status in contract.STATUSES:  # e.g. rank 1's oom
            record.status = status


def describe(exc: BaseException) -> str:
    """One line saying what happened, then the last frames of where."""
    first = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    tail = "".join(traceback.format_exception(exc)[-6:])
    return f"{first}\n{tail}"


def main(argv: list[str] | None = None) -> int:
    process_start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    tie_to_launcher()  # first: a rank must not outlive a launcher that dies while torch imports
    tolerate_closed_readers()  # stdout and stderr: a dead reader must not stop the record
    cfg = parse_args(argv)
    denv = detect()
    try:
        check(cfg, denv.world_size, denv.rank, denv)
        from shardbench.trainer.env_info import process_start_time
        from shardbench.trainer.train import Trainer  # torch is imported only after the cheap checks

        trainer = Trainer(cfg, denv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    process_start = min(process_start, process_start_time())
    # On a cluster the suite cannot read the ranks' /proc: the stamp is how it measures the
    # launcher's start-up there (suite/execute/startup.py). After the checks: a refused run says one line.
    print(f'{START_STAMP}{{"rank": {denv.rank}, "t": {process_start:.3f}}}', file=sys.stderr, flush=True)
    from shardbench.trainer import exporter

    metrics = exporter.start(cfg, trainer.record, denv.rank, denv.local_rank)
    if metrics is not None:
        trainer.observers.append(metrics)
        print(f"rank {denv.rank}: metrics on port {metrics.port}", file=sys.stderr, flush=True)
    if denv.rank == 0:
        _catch_signals()
    try:
        trainer.init_process_group()
        # Other ranks catch SIGTERM only once the rendezvous is done: blocked in it (waiting for a
        # rank 0 that refused to start, e.g. on a busy checkpoint dir) a Python handler never
        # runs, so torchrun's SIGTERM was ignored until its SIGKILL 30 s later; they have no
        # record to write before it anyway.
        _catch_signals()
        trainer.build()
        trainer.train(process_start)
        record = trainer.finish(process_start)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a record
        _hold_signals()
        if denv.rank == 0:
            announce_rank0(cfg.output_dir)  # the other ranks hold their exit while it reports
        record = trainer.record
        trainer.fill_timings(record)
        record.status = classify(exc)
        record.error = describe(exc)
        if denv.rank == 0 and not isinstance(exc, Terminated):
            _blame_earlier_failures(record, cfg.output_dir, process_start)
        _report(record, cfg, denv.rank)  # the record first: nothing printed may come before it
        print(f"rank {denv.rank}: {record.status}: {record.error}", file=sys.stderr, flush=True)
        if denv.rank != 0:
            leave_failure_note(cfg.output_dir, denv.rank, record.status, record.error.splitlines()[0])
            close_peer_connections()  # rank 0 may wait in a collective for this rank: free it to report
            hold_for_rank0(cfg.output_dir, process_start)  # mpirun ends rank 0 once this rank exits
        _release_signals()
        _end_metrics(metrics, record, cfg, hold=not isinstance(exc, Terminated))  # stopped: no lingering
        # A broken process group can hang in its destructors: skip them.
        _exit_now(1)
    _hold_signals()
    saved = _report(record, cfg, denv.rank)
    _release_signals()  # only for the metrics hold: a signal may end it at once, the record is out
    _end_metrics(metrics, record, cfg)
    _hold_signals()
    if not saved:
        _exit_now(1)
    _shutdown()
    # Even a clean group can abort in interpreter teardown: gloo's C++ threads are destroyed
    # after Python is gone ("terminate called without an active exception", about 1 run in 12
    # at world size 2 on this 2-core machine). Everything is reported by now, so skip it.
    _exit_now(0)


def _catch_signals() -> None:
    """SIGTERM/SIGINT become Terminated: a failed record of what was measured."""
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def _release_signals() -> None:
    """The record is out: a signal may now end the process at once (e.g. during the metrics hold)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _hold_signals() -> None:
    """The run is over and its record is being written: a second SIGTERM/SIGINT (a launcher
    passing on the first, a Ctrl-C again) must not interrupt that."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _report(record, cfg: RunConfig, rank: int) -> bool:
    """Rank 0: result.json first (the durable copy), then the record on stdout. False when the
    file could not be written (the printed record is then the only copy)."""
    if rank != 0:
        return True
    saved = True
    if cfg.output_dir:
        path = os.path.join(cfg.output_dir, "result.json")
        try:
            write_atomic(record, path)
        except OSError as exc:
            saved = False
            print(f"rank 0: could not write {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
    emit(record)
    return saved


def _end_metrics(metrics, record, cfg: RunConfig, hold: bool = True) -> None:
    """After the record is out: the final values, served --metrics-hold-s more seconds."""
    if metrics is not None:
        metrics.finish(record)
        metrics.close(cfg.metrics_hold_s if hold else 0.0)


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _exit_now(code: int) -> NoReturn:
    """Flush, finalize MPI if the rendezvous started it (prterun counts a rank that skips
    MPI_Finalize as failed), and leave without running C++ static destructors."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away
            pass
    mpi = sys.modules.get("mpi4py.MPI")
    if code == 0 and mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    os._exit(code)
