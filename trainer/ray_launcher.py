"""`python -m shardbench.trainer.ray_launcher`: Ray as a launcher. Starts the trainer's ranks as Ray actors
and restarts the whole group when one fails, as Ray Train's FailureConfig(max_failures) does.

    python -m shardbench.trainer.ray_launcher --world-size 2 --max-restarts 2 [--local] -- <trainer args>

- Where: `--local` starts an embedded Ray on this machine (`ray.init(address="local")`: no server
  to start, its own temp dir, no dashboard) and shuts it down at the end; without it the
  driver joins the cluster it runs in (`RAY_ADDRESS`, which a KubeRay RayJob sets).
- Ranks: one actor per rank (`RankActor`, 1 CPU, or 1 GPU with `--gpus-per-rank 1`). Each runs
  the trainer entry point `python -u -m shardbench.trainer ...` as a child process with the torchrun
  variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); rank 0's
  actor picks the rendezvous address and port on its node. A child, not the actor's own
  interpreter: the trainer pins CPUs, sets threads and ends with os._exit, as under any other
  launcher, and it dies with its actor (PR_SET_PDEATHSIG, trainer/lifeline.py).
- Output: every rank's stdout comes back through the actor's streaming generator and is printed
  here unchanged (not through Ray's log forwarding, which prefixes and de-duplicates lines), so
  the result record and progress lines reach the suite as under torchrun.
- Restarts: when a rank exits non-zero or its actor dies, the other ranks are ended and, up to
  --max-restarts times, a new group is started; the trainer resumes from its own checkpoints
  (--resume auto): the checkpoint stays the one source of truth, Ray only relaunches.
- Events for the suite: one line each, `SHARDBENCH_RAY {"event": ..., "attempt": k, ...}`
  (launch, failed, done), which the Ray backends turn into the record's fault timings, and
  `rank` (its node's hostname and IP): on a cluster the suite deletes the pod that holds the
  rank a kill-rank fault names (suite/backends/kube/rayjob.py).
- SIGTERM/SIGINT: no relaunch; the ranks get SIGTERM through their actors (each writes its
  failed record), then Ray shuts down. Exit code: 0 when the last group finished, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

EVENT_PREFIX = "SHARDBENCH_RAY "
STOP_GRACE_S = 10.0
"""Seconds the ranks get after SIGTERM to report before their actors are killed."""

_print_lock = threading.Lock()


def say(text: str) -> None:
    with _print_lock:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()


def event(kind: str, attempt: int, **extra) -> None:
    say(EVENT_PREFIX + json.dumps({"event": kind, "attempt": attempt, "t": time.time(), **extra}))


def _pdeathsig() -> None:
    from shardbench.trainer.lifeline import _set_pdeathsig

    _set_pdeathsig(signal.SIGTERM)


class RankActor:
    """One rank: runs the trainer as a child process and streams its output back."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def endpoint(self, local: bool) -> tuple[str, int]:
        """Rendezvous address and a free port on this actor's node (rank 0's)."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ("127.0.0.1" if local else ray.util.get_node_ip_address()), port

    def run(self, argv: list[str], env: dict[str, str], cwd: str):
        """Yields the child's output lines, then {"exit": code}."""
        self.proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)
        import ray

        yield {"pid": self.proc.pid, "host": socket.gethostname(), "ip": ray.util.get_node_ip_address()}
        for raw in iter(self.proc.stdout.readline, b""):
            yield raw.decode("utf-8", "replace")
        yield {"exit": self.proc.wait()}

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)  # a stopped rank acts on nothing until continued


class Group:
    """One attempt: world_size actors, each streaming its rank's output into this process."""

    def __init__(self, ray, actor_cls, args, attempt: int):
        self.ray, self.args, self.attempt = ray, args, attempt
        self.actors = [actor_cls.remote() for _ in range(args.world_size)]
        self.exits: dict[int, object] = {}
        self.failures: list[str] = []
        """Why ranks ended badly, in the order they did."""
        self.failed = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, trainer_args: list[str]) -> None:
        addr, port = self.ray.get(self.actors[0].endpoint.remote(self.args.local))
        n = self.args.world_size
        for rank, actor in enumerate(self.actors):
            env = {"RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank % self.args.ranks_per_node),
                   "LOCAL_WORLD_SIZE": str(min(n, self.args.ranks_per_node)),
                   "MASTER_ADDR": addr, "MASTER_PORT": str(port)}
            argv = [self.args.python, "-u", "-m", "shardbench.trainer", *trainer_args]
            gen = actor.run.remote(argv, env, os.getcwd())
            t = threading.Thread(target=self._relay, args=(rank, gen), daemon=True, name=f"rank-{rank}")
            t.start()
            self.threads.append(t)

    def _relay(self, rank: int, gen) -> None:
        try:
            for ref in gen:
                item = self.ray.get(ref)
                if isinstance(item, str):
                    say(item)
                elif "pid" in item:
                    event("rank", self.attempt, rank=rank, **item)
                elif "exit" in item:
                    self.exits[rank] = item["exit"]
        except Exception as exc:  # noqa: BLE001 - an actor that died is a failed rank
            self.exits[rank] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        why = self.exits.get(rank, "no exit status")
        if why != 0:
            self.failures.append(f"rank {rank} " + (f"exited with {why}" if isinstance(why, int)
                                                    else f"lost its actor ({why})"))
            self.failed.set()

    def done(self) -> bool:
        return all(not t.is_alive() for t in self.threads)

    def first_failure(self) -> str | None:
        return self.failures[0] if self.failures else None

    def stop(self, grace_s: float) -> None:
        """SIGTERM every rank (each writes its failed record), then kill the actors."""
        for actor in self.actors:
            try:
                actor.terminate.remote()
            except Exception:  # noqa: BLE001 - a dead actor needs no stopping
                pass
        deadline = time.monotonic() + grace_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001
                pass


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    if "--" not in argv:
        raise SystemExit("error: give the trainer's arguments after -- (see --help)")
    cut = argv.index("--")
    p = argparse.ArgumentParser(prog="python -m shardbench.trainer.ray_launcher", description=__doc__.split("\n\n")[0])
    p.add_argument("--world-size", type=int, required=True, help="ranks (one actor each)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="group relaunches after a failure (Ray Train's FailureConfig max_failures)")
    p.add_argument("--local", action="store_true", help="start an embedded Ray here instead of joining a cluster")
    p.add_argument("--ranks-per-node", type=int, default=None, help="for LOCAL_RANK (default: world size)")
    p.add_argument("--gpus-per-rank", type=float, default=0, help="GPUs each rank's actor reserves")
    p.add_argument("--temp-dir", default=None, help="Ray's temp dir for --local (keep it short: socket paths)")
    p.add_argument("--python", default=sys.executable, help="interpreter the ranks run")
    args = p.parse_args(argv[:cut])
    args.ranks_per_node = args.ranks_per_node or args.world_size
    return args, argv[cut + 1:]


def _init(ray, args) -> None:
    if args.local:
        ray.init(address="local", num_cpus=args.world_size, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _temp_dir=args.temp_dir)
    else:
        ray.init(log_to_driver=False, configure_logging=False)


def main(argv: list[str] | None = None) -> int:
    from shardbench.trainer.env_info import process_start_time
    from shardbench.trainer.record import START_STAMP

    # The launch command's start, for launcher_startup_s on a cluster (suite/startup.py); this
    # process's start from /proc, as the local backend reads it.
    args, trainer_args = parse_args(sys.argv[1:] if argv is None else argv)
    say(f'{START_STAMP}{{"launcher": {process_start_time():.3f}}}')
    stopping = threading.Event()

    def on_signal(*_):
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    import ray

    _init(ray, args)
    # ray.init installs its own SIGTERM handler (it exits at once): ours again, so a timeout or
    # cancel stops the ranks gracefully and they report what they measured.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    actor_cls = ray.remote(num_cpus=1, num_gpus=args.gpus_per_rank, max_concurrency=2)(RankActor)
    code = 1
    try:
        for attempt in range(args.max_restarts + 1):
            event("launch", attempt, world_size=args.world_size, max_restarts=args.max_restarts)
            group = Group(ray, actor_cls, args, attempt)
            group.start(trainer_args)
            while not group.done() and not group.failed.is_set() and not stopping.is_set():
                time.sleep(0.1)
            if stopping.is_set():
                group.stop(STOP_GRACE_S)
                event("stopped", attempt)
                break
            failure = group.first_failure()
            if failure is None:
                event("done", attempt)
                code = 0
                break
            event("failed", attempt, reason=failure)
            group.stop(STOP_GRACE_S)
            if attempt == args.max_restarts:
                say(f"[ray] giving up after {attempt + 1} attempt(s): {failure}")
    finally:
        ray.shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
