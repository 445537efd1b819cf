"""Failures are results: a dead rank ends the job (no hang), an exception or out-of-memory gives
a record with its status and error."""
from __future__ import annotations

import pytest

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.trainer.conftest import REPO, command, cpu_env, free_port
from shardbench.trainer.record import END_MARKER, START_MARKER

pytestmark = pytest.mark.slow  # multi-process runs

LONG_RUN = ["--strategy", "ddp", "--steps", "100000", "--warmup-steps", "1", "--seq-len", "32",
            "--micro-batch", "2", "--pg-timeout-s", "30"]


def wait_for_step(proc: subprocess.Popen, step: int, deadline: float) -> list[str]:
    """Read rank 0's stdout until it reports `step`."""
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("SHARDBENCH_PROGRESS ") and json.loads(line.split(" ", 1)[1])["step"] >= step:
            return lines
    raise AssertionError("rank 0 never reached step %d:\n%s" % (step, "".join(lines[-20:])))


def record_in(text: str) -> dict:
    return json.loads(text.split(START_MARKER, 1)[1].split(END_MARKER, 1)[0])


def test_killed_rank_ends_the_others_with_a_failed_record():
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = cpu_env() | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen([sys.executable, "-u", "-m", "shardbench.trainer", *LONG_RUN], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        seen = wait_for_step(ranks[0], 3, time.time() + 120)
        killed_at = time.time()
        ranks[1].send_signal(signal.SIGKILL)
        out, err = ranks[0].communicate(timeout=30 + 15)
        elapsed = time.time() - killed_at
    finally:
        for p in ranks:
            p.kill()
    assert ranks[0].returncode == 1
    assert elapsed < 45
    record = record_in("".join(seen) + out)
    assert record["status"] == "failed"
    assert record["error"] and "rank 0: failed" in err
    assert record["measured_steps"] >= 2 and record["tokens_per_s"] > 0  # what it measured is kept


def test_rank_0s_record_names_the_rank_whose_sigterm_broke_its_collective(tmp_path):
    """Only rank 1 gets SIGTERM (a launcher passing it on rank by rank, or one pod's): it shuts
    its connections to free rank 0 (trainer/lifeline.py), and rank 0's collective fails on a
    closed connection. Its record said only that gloo error, so the suite-death test under load
    found a failed record without the SIGTERM that ended the run. Rank 1 now leaves a note first:
    the record names rank 1's SIGTERM, then rank 0's own error, and the note is gone."""
    port, out_dir = free_port(), tmp_path / "out"
    ranks = []
    for rank in (0, 1):
        env = cpu_env() | {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(subprocess.Popen([sys.executable, "-u", "-m", "shardbench.trainer", *LONG_RUN,
                                       "--output-dir", str(out_dir)], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        wait_for_step(ranks[0], 3, time.time() + 120)
        ranks[1].send_signal(signal.SIGTERM)
        ranks[0].communicate(timeout=45)
        ranks[1].communicate(timeout=45)
    finally:
        for p in ranks:
            p.kill()
    record = json.loads((out_dir / "result.json").read_text())
    first, then = record["error"].splitlines()[:2]
    assert record["status"] == "failed"
    assert first == "rank 1 failed first (failed): Terminated: terminated by signal SIGTERM", record["error"]
    assert then.startswith("then rank 0: "), record["error"]
    assert not list(out_dir.glob(".rank*-failed*"))


def _rank_pids(launcher_pid: int) -> dict[int, int]:
    """OMPI rank -> pid for processes descended from launcher_pid."""
    found = {}
    for pid in _descendants(launcher_pid):
        try:
            env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var.startswith(b"OMPI_COMM_WORLD_RANK="):
                found[int(var.split(b"=")[1])] = pid
    return found


def test_killed_rank_under_mpirun_ends_the_job(tmp_path):
    env = cpu_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(command(LONG_RUN, "mpirun", 2, tmp_path), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_step(proc, 3, time.time() + 120)
        pids = _rank_pids(proc.pid)
        assert set(pids) == {0, 1}, pids
        killed_at = time.time()
        os.kill(pids[1], signal.SIGKILL)
        proc.communicate(timeout=45)
        elapsed = time.time() - killed_at
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode != 0
    assert elapsed < 45
    assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
                   for pid in pids.values())


def test_out_of_memory_is_a_record_with_status_oom(tmp_path):
    def cap_memory():
        # 4 GiB of address space: torch and the 350M model load, its 5.7 GB of model state does
        # not fit. (It fits the host, so the trainer's up-front memory check lets it start.)
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "shardbench.trainer", "--strategy", "ddp", "--model", "gpt2-350m",
                           "--seq-len", "128", "--steps", "2", "--warmup-steps", "1", "--output-dir", str(out)],
                          cwd=REPO, env=cpu_env(), capture_output=True, text=True, timeout=300,
                          preexec_fn=cap_memory)
    assert proc.returncode == 1, proc.stderr[-2000:]
    record = record_in(proc.stdout)
    assert record["status"] == "oom", record["error"]
    assert json.loads((out / "result.json").read_text())["status"] == "oom"
    assert record["model"]["preset"] == "gpt2-350m" and record["measured_steps"] == 0


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if "zombie" not in Path(f"/proc/{pid}/status").read_text():
                alive.append(pid)
        except OSError:
            pass
    return alive


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.mark.slow
@pytest.mark.parametrize("launcher,strategy", [("mpirun", "ddp"), ("deepspeed", "zero2")])
def test_sigterm_to_the_launcher_gives_a_failed_record_and_no_orphans(tmp_path, launcher, strategy):
    """Only the launcher gets SIGTERM (as a scheduler or `kill` would send it). Rank 0 still
    leaves a failed record in result.json, and no rank outlives the launcher: mpirun dies at
    once (its stdout goes with it, hence the file), the DeepSpeed launcher leaves mpirun and the
    ranks behind unless they watch it (trainer/lifeline.py)."""
    out = tmp_path / "out"
    args = [*LONG_RUN, "--strategy", strategy, "--output-dir", str(out)]
    env = cpu_env() | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    proc = subprocess.Popen(command(args, launcher, 2, tmp_path), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_for_step(proc, 3, time.time() + 180)
        tree = _descendants(proc.pid)
        assert len(tree) >= 2, tree
        proc.send_signal(signal.SIGTERM)
        try:  # orphaned ranks would hold the pipe open: do not wait for its end for ever
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 45
        while _alive(tree) and time.time() < deadline:
            time.sleep(0.5)
        left = _alive(tree)
    finally:
        for pid in [proc.pid, *_alive(_descendants(proc.pid))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert left == [], f"orphaned ranks: {left}"
    record = json.loads((out / "result.json").read_text())
    # Rank 0 reports SIGTERM, or the broken collective when the other rank stopped first.
    assert record["status"] == "failed" and record["error"]
    assert record["measured_steps"] >= 2 and record["tokens_per_s"] > 0


BLOCKED_RANK0 = r"""
import os, sys, time, torch, torch.distributed as dist
from datetime import timedelta
from shardbench.trainer.lifeline import close_peer_connections
rank, port, flag, close = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "close"
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=120))
dist.all_reduce(torch.ones(4))  # both in step
if rank == 0:
    try:
        dist.all_reduce(torch.ones(4))  # rank 1 never joins this one
    except RuntimeError as exc:
        open(flag, "w").write(str(exc)[:200])
    os._exit(0)
if close:
    print("shut", close_peer_connections(), flush=True)
deadline = time.time() + 8  # alive, as a holding rank is, until rank 0 is free (or 8 s)
while time.time() < deadline and not os.path.exists(flag):
    time.sleep(0.05)
print("rank 0 freed while rank 1 lived" if os.path.exists(flag) else "rank 0 still blocked", flush=True)
os._exit(0)
"""


def test_a_failing_rank_frees_rank_0_from_the_collective_it_will_never_join(tmp_path):
    """The record lost to a SIGTERM to mpirun on a loaded host (4 of 14 times, 6 CPU burners):
    rank 0 sat in a collective rank 1 would never join, so its SIGTERM handler could not run until
    rank 1 exited, and that is when prterun SIGKILLs it. trainer/lifeline.py
    close_peer_connections (called by a failing non-zero rank before it holds for rank 0) shuts
    rank 1's TCP connections: rank 0's collective fails while rank 1 still lives. Without the
    call (the old path) rank 0 stays blocked as long as rank 1 lives."""
    def run(close: bool) -> str:
        flag, port = tmp_path / f"freed-{close}", str(free_port())
        procs = [subprocess.Popen([sys.executable, "-c", BLOCKED_RANK0, str(rank), port, str(flag),
                                   "close" if close else "keep"], cwd=REPO, env=cpu_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        return outs[1][0] + outs[1][1][-2000:] + outs[0][1][-2000:]

    freed = run(close=True)
    assert "rank 0 freed while rank 1 lived" in freed and "shut 0" not in freed, freed
    kept = run(close=False)
    assert "rank 0 still blocked" in kept, kept
