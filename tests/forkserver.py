"""Trainer runs without paying torch's and DeepSpeed's import in each process.

A `python -m shardbench.trainer` spends most of its wall time importing (torch, DeepSpeed, the
trainer: 4-8 s of a 10 s run on this 2-core machine), and torchrun adds its own interpreter. A
fork server imports them once per pytest session (per xdist worker), in a process that has run no
torch op and started no thread, and forks a child per rank: the child sets the run's environment
and working directory, points fds 0/1/2 at /dev/null and two files, and calls
`shardbench.trainer.cli.main(argv)`, which ends with os._exit as a real run does. So each rank is
still its own process (its own process group, signals, affinity, threads and exit), only its
imports are inherited. The ranks of a multi-rank run get the environment torchrun gives its
workers and share the first rank's process group; no torchrun process runs.

Not for: runs under mpirun or the DeepSpeed launcher, runs whose launcher or start-up is what a
test checks (the record's time_to_first_step_s starts at the fork), and an environment that
changes what the imports saw (`_IMPORT_ENV`): those run as subprocesses.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from shardbench.trainer import ports

REPO = Path(__file__).resolve().parents[1]

PRELOAD = ("torch._dynamo",  # AdamW's constructor imports it: 1-10 s of every run here
           "torch.distributed.fsdp", "torch.distributed.checkpoint", "torch.distributed.tensor",
           "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.stage_1_and_2", "deepspeed.ops.op_builder")
"""What runs import lazily, after the trainer has wrapped the collectives (so imported after it)."""

# Runs in the server process: preload in the trainer's own order (collectives wrapped before
# DeepSpeed is imported, as Trainer() does before a ZeRO strategy imports it), then serve.
SERVER = r"""
PRELOAD = %r
import json, os, sys, traceback
proto_in, proto_out = sys.stdin, os.fdopen(os.dup(1), "w")  # the protocol; prints go elsewhere
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
from shardbench.trainer import cli
from shardbench.trainer.train import Trainer  # noqa: F401 - torch and the strategies
from shardbench.trainer.comm import COUNTER
COUNTER.install()
from shardbench.trainer.strategies.zero import import_deepspeed
import_deepspeed()
import importlib
for name in PRELOAD:
    importlib.import_module(name)
import threading
assert threading.active_count() == 1, "a preloaded import started a thread: forking would lose it"
import importlib.util
MAIN = importlib.util.find_spec("shardbench.trainer.__main__").origin
sys.stdout.flush()
print(json.dumps({"ready": os.getpid()}), file=proto_out, flush=True)
import signal, time
def start(req, rank_req, group):
    # Fork one rank; in the child: its group, fds, environment and cli.main (never returns).
    pid = os.fork()
    if pid:
        try:
            os.setpgid(pid, group or pid)  # also here: the child may not have run yet
        except OSError:
            pass
        return pid
    code = 1
    try:
        os.setpgid(0, group)  # its own group (the first rank's), as a subprocess the test kills on a timeout
        proto_out.close()
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(rank_req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, path in ((1, rank_req["stdout"]), (2, rank_req["stderr"])):
            out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        sys.argv = [MAIN, *req["argv"]]
        code = cli.main(req["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)
def reap(pids, group):
    # Exit codes by rank. As torchrun's agent does, a rank that fails gets the others stopped:
    # SIGTERM after FAIL_GRACE_S (they may be finishing their own failure), SIGKILL 10 s later.
    codes, failed_at, sent = {}, None, set()
    while len(codes) < len(pids):
        for pid in [p for p in pids if p not in codes]:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                if codes[pid] != 0 and failed_at is None:
                    failed_at = time.monotonic()
        late = 0.0 if failed_at is None else time.monotonic() - failed_at
        for limit, sig in ((FAIL_GRACE_S, signal.SIGTERM), (FAIL_GRACE_S + 10, signal.SIGKILL)):
            if late > limit and sig not in sent:  # each once, as torchrun's agent sends them
                sent.add(sig)
                try:
                    os.killpg(group, sig)
                except ProcessLookupError:
                    pass
        time.sleep(0.02)
    return [codes[p] for p in pids]
FAIL_GRACE_S = 10.0
for line in proto_in:
    req = json.loads(line)
    pids = []
    for rank_req in req["ranks"]:
        pids.append(start(req, rank_req, pids[0] if pids else 0))
    print(json.dumps({"pid": pids[0]}), file=proto_out, flush=True)
    print(json.dumps({"rcs": reap(pids, pids[0])}), file=proto_out, flush=True)
""" % (PRELOAD,)

_IMPORT_ENV = ("PYTHONPATH", "PYTHONWARNINGS", "PYTHONHASHSEED", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
               "MKL_NUM_THREADS", "LD_PRELOAD", "LD_LIBRARY_PATH", "DS_ACCELERATOR")
"""Variables read while importing: a run that sets them otherwise than the server gets a subprocess."""


class ForkServer:
    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, env=self.env, text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._tmp = tempfile.TemporaryDirectory(prefix="forkserver-")
        self._buf = b""
        self._read(300.0)  # {"ready": pid} once the imports are done

    def fits(self, env: dict[str, str]) -> bool:
        return all(env.get(k) == self.env.get(k) for k in _IMPORT_ENV)

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float,
            nproc: int = 1) -> tuple[int, str, str]:
        """(exit code, stdout, stderr) of one trainer run of `nproc` ranks (each rank's output in
        rank order); subprocess.TimeoutExpired after killing every rank when it outlives
        `timeout`, as subprocess.run does. More than one rank: each gets the environment torchrun
        gives its workers (rank, local rank, sizes, rendezvous address) and the first failure
        stops the others as torchrun's agent does; the exit code is the first failed rank's."""
        with self._lock:
            tmp = Path(self._tmp.name)
            port = free_port()
            ranks = [{"env": rank_env(env, rank, nproc, port), "stdout": str(tmp / f"stdout-{rank}"),
                      "stderr": str(tmp / f"stderr-{rank}")} for rank in range(nproc)]
            self._proc.stdin.write(json.dumps({"argv": argv, "cwd": str(cwd), "ranks": ranks}) + "\n")  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            group = json.loads(self._read(30.0))["pid"]
            try:
                codes = json.loads(self._read(timeout))["rcs"]
            except TimeoutError:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._read(30.0)
                raise subprocess.TimeoutExpired(["shardbench.trainer", *argv], timeout, *outputs(ranks))
            return (next((c for c in codes if c != 0), 0), *outputs(ranks))

    def _read(self, timeout: float) -> str:
        """One protocol line, read from the fd itself (a buffered reader could hold the next
        line where select cannot see it)."""
        fd = self._proc.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._buf:
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the fork server died (exit {self._proc.wait()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def close(self) -> None:
        if self._proc.poll() is None:  # idle between runs, nothing to flush: torch's teardown costs seconds
            self._proc.kill()
            self._proc.wait()
        self._tmp.cleanup()


def free_port() -> int:
    return ports.free_port("127.0.0.1")


def rank_env(env: dict[str, str], rank: int, nproc: int, port: int) -> dict[str, str]:
    """A rank's environment: the run's, plus what torchrun sets for a worker when nproc > 1."""
    if nproc == 1:
        return env
    return {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def outputs(ranks: list[dict]) -> tuple[str, str]:
    """(stdout, stderr): every rank's, in rank order."""
    return tuple("".join(Path(r[name]).read_text(errors="replace") if Path(r[name]).exists() else ""
                         for r in ranks) for name in ("stdout", "stderr"))  # type: ignore[return-value]


_SERVER: ForkServer | None = None


def server(env: dict[str, str]) -> ForkServer | None:
    """This session's fork server, started on first use; None when SHARDBENCH_TEST_NO_FORK is set
    (every one-rank run then starts its own interpreter, as before)."""
    global _SERVER
    if os.environ.get("SHARDBENCH_TEST_NO_FORK"):
        return None
    if _SERVER is None:
        _SERVER = ForkServer(env)
    return _SERVER


def close() -> None:
    global _SERVER
    if _SERVER is not None:
        _SERVER.close()
        _SERVER = None
