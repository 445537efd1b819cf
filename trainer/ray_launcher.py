"""`python -m shardbench.trainer.ray_launcher`: Ray as a launcher. Starts the trainer's ranks as Ray actors
and restarts the whole group when one fails, as Ray Train's FailureConfig(max_failures) does.

    python -m shardbench.trainer.ray_launcher --world-size 2 --max-restarts 2 [--local] -- <trainer args>

- Where: `--local` starts an embedded Ray on this machine (`ray.init(address="local")`: no server
  to start, its own temp dir, no dashboard) and shuts it down at the end; without it the
  driver joins the cluster it runs in (`RAY_ADDRESS`, which a KubeRay RayJob sets).
- Ranks: one actor per rank (`RankActor`, 1 CPU, or 1 GPU with `--gpus-per-rank 1`), packed
  --ranks-per-node to a node by a placement group (one bundle per node, STRICT_SPREAD over
  nodes): LOCAL_RANK and the trainer's CPU pinning assume a node's ranks are together. Each runs
  the trainer entry point `python -u -m shardbench.trainer ...` as a child process with the torchrun
  variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); rank 0's
  actor picks the rendezvous address and port on its node.
- Devices (`device_env`): Ray gives a GPU actor CUDA_VISIBLE_DEVICES of its own GPU only, where
  LOCAL_RANK 3 would be an invalid ordinal (DeepSpeed's engine calls set_device(LOCAL_RANK)). As
  Ray Train does, each rank sees every GPU of its node's ranks and LOCAL_RANK is its own GPU's
  position among them, which also leaves NCCL its intra-node P2P paths. A child, not the actor's own
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

    def placement(self) -> tuple[str, list[str]]:
        """This actor's node and the GPUs Ray assigned to it."""
        import ray

        return ray.get_runtime_context().get_node_id(), [str(g) for g in ray.get_gpu_ids()]

    def endpoint(self, local: bool) -> tuple[str, int]:
        """Rendezvous address and a free port on this actor's node (rank 0's)."""
        import ray

        from shardbench.trainer.ports import free_port

        return ("127.0.0.1" if local else ray.util.get_node_ip_address()), free_port()

    def run(self, argv: list[str], env: dict[str, str], cwd: str):
        """Yields the child's output lines, then {"exit": code}."""
        self.proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)
        import ray

        yield {"pid": self.proc.pid, "host": socket.gethostname(), "ip": ray.util.get_node_ip_address()}
        for raw in iter(self.proc.stdout.readline, b""):  # type: ignore[union-attr]
            yield raw.decode("utf-8", "replace")
        yield {"exit": self.proc.wait()}

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.send_signal(signal.SIGCONT)  # a stopped rank acts on nothing until continued


def node_sizes(world_size: int, ranks_per_node: int) -> list[int]:
    """Ranks on each node, in rank order: full nodes, the last one holding the rest."""
    return [min(ranks_per_node, world_size - start) for start in range(0, world_size, ranks_per_node)]


def device_env(placements: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    """LOCAL_RANK, LOCAL_WORLD_SIZE and (GPU ranks) CUDA_VISIBLE_DEVICES per rank, from each
    rank's (node, GPU ids): a GPU rank sees its node's GPUs, LOCAL_RANK is its own one's index."""
    by_node: dict[str, list[int]] = {}
    for rank, (node, _) in enumerate(placements):
        by_node.setdefault(node, []).append(rank)
    out: list[dict[str, str]] = [{} for _ in placements]
    for ranks in by_node.values():
        visible = sorted({g for r in ranks for g in placements[r][1]}, key=lambda g: (len(g), g))
        for i, rank in enumerate(ranks):
            env = {"LOCAL_WORLD_SIZE": str(len(ranks)), "LOCAL_RANK": str(i)}
            own = placements[rank][1]
            if own:
                env.update(CUDA_VISIBLE_DEVICES=",".join(visible), LOCAL_RANK=str(visible.index(own[0])))
            out[rank] = env
    return out


class Group:
    """One attempt: world_size actors, each streaming its rank's output into this process."""

    def __init__(self, ray, actor_cls, args, attempt: int):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.ray, self.args, self.attempt = ray, args, attempt
        sizes = node_sizes(args.world_size, args.ranks_per_node)
        bundles = [{"CPU": n, **({"GPU": n * args.gpus_per_rank} if args.gpus_per_rank else {})} for n in sizes]
        self.pg = placement_group(bundles, strategy="STRICT_SPREAD" if len(sizes) > 1 else "STRICT_PACK")
        self.actors = [actor_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            self.pg, placement_group_bundle_index=rank // args.ranks_per_node)).remote()
            for rank in range(args.world_size)]
        self.exits: dict[int, object] = {}
        self.failures: list[str] = []
        """Why ranks ended badly, in the order they did."""
        self.failed = threading.Event()
        self.threads: list[threading.Thread] = []

    def start(self, trainer_args: list[str]) -> None:
        addr, port = self.ray.get(self.actors[0].endpoint.remote(self.args.local))
        devices = device_env(self.ray.get([actor.placement.remote() for actor in self.actors]))
        n = self.args.world_size
        for rank, actor in enumerate(self.actors):
            env = {"RANK": str(rank), "WORLD_SIZE": str(n), **devices[rank],
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
        try:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)  # the next attempt reserves its nodes afresh
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

    # The launch command's start, for launcher_startup_s on a cluster (suite/execute/startup.py); this
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
    actor_cls = ray.remote(num_cpus=1, num_gpus=args.gpus_per_rank, max_concurrency=2)(RankActor)  # type: ignore[call-overload]
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
