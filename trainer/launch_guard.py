"""The launcher pod's guard: docker/entrypoint.sh runs the launch command under it.

OpenMPI 5's mpirun (prterun) now and then never exits after every rank has (openpmix/prrte#1839,
5-10% of runs there): the MPIJob's launcher then runs until the job's deadline, holding every
GPU of the job. The guard passes the launcher's output through line by line; once rank 0's record
has come through (its END marker), the launcher has `SHARDBENCH_TEARDOWN_GRACE_S` (default
TEARDOWN_GRACE_S) to exit, then it is stopped and the guard exits 0 when the record says ok, else
1. Otherwise the guard exits with the launcher's code. SIGTERM and SIGINT (the kubelet stopping
the pod) go to the launcher. The local backend applies the same grace (suite/backends/local.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from shardbench.trainer.record import END_MARKER, START_MARKER

TEARDOWN_GRACE_S = 30.0
"""How long a launcher may run on after rank 0's record before it is stopped. Ranks and launchers
end within seconds of the record otherwise."""
STOP_GRACE_S = 5.0
"""Between SIGTERM and SIGKILL when the guard stops the launcher."""


class RecordWatch:
    """Reads the launcher's output, passes it on, and notes rank 0's record and when it ended."""

    def __init__(self) -> None:
        self.block: list[str] | None = None
        self.status: str | None = None
        self.seen_at: float | None = None

    def feed(self, line: str) -> None:
        if START_MARKER in line:
            self.block = []
        elif END_MARKER in line and self.block is not None:
            self.status = _status(self.block)
            self.block, self.seen_at = None, time.monotonic()
        elif self.block is not None:
            self.block.append(line)


def _status(block: list[str]) -> str:
    for line in block:
        try:
            return str(json.loads(line[line.index("{"):]).get("status"))
        except ValueError:
            continue
    return "unreadable"


def _pump(stream, out, watch: RecordWatch) -> None:
    for raw in iter(stream.readline, b""):
        out.write(raw)
        out.flush()
        watch.feed(raw.decode("utf-8", "replace"))


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m shardbench.trainer.launch_guard COMMAND [ARG...]", file=sys.stderr)
        return 2
    grace = float(os.environ.get("SHARDBENCH_TEARDOWN_GRACE_S", TEARDOWN_GRACE_S))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    watch = RecordWatch()
    pump = threading.Thread(target=_pump, args=(proc.stdout, sys.stdout.buffer, watch), daemon=True)
    pump.start()
    while proc.poll() is None:
        if watch.seen_at is not None and time.monotonic() > watch.seen_at + grace:
            return _stop(proc, pump, watch, grace)
        time.sleep(0.2)
    pump.join()
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def _stop(proc: subprocess.Popen, pump: threading.Thread, watch: RecordWatch, grace: float) -> int:
    launcher = os.path.basename(str(proc.args[0]))  # type: ignore[index]  # a list: main() made it
    print(f"shardbench-entrypoint: {launcher} had not exited {grace:g} s after "
          f"rank 0's record (OpenMPI 5's teardown hang, openpmix/prrte#1839): stopping it; the record "
          f"says {watch.status}", file=sys.stderr, flush=True)
    proc.terminate()
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    pump.join(timeout=5)
    return 0 if watch.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
