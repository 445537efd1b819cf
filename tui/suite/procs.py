"""Process-tree control for launcher runs: find and end every process a launcher started.

A launcher (mpirun, deepspeed -> mpirun, torchrun) is started in a new session
(start_new_session=True), so its whole tree shares that session id even when a launcher moves
ranks into process groups of their own. Ending a run therefore signals the process group and
then every process left in the session, SIGTERM first, SIGKILL after a grace period. Linux /proc
only (the local backend's platform).
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes().decode("utf-8", errors="replace")
    except OSError:  # gone between listdir and read
        return None
    # comm (field 2) may hold spaces and parens: split after the last ')'.
    return raw[raw.rfind(")") + 2:].split()


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        # fields[0] = state, fields[3] = session id (stat fields 3 and 6).
        if fields and len(fields) > 3 and fields[0] != "Z" and fields[3] == str(sid):
            pids.append(int(entry))
    return pids


def _signal_all(sid: int, sig: int) -> None:
    try:
        os.killpg(sid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in session_pids(sid):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_session(sid: int, grace_s: float = 5.0) -> None:
    """SIGTERM the session started by `sid`, then SIGKILL whatever is left after `grace_s`."""
    _signal_all(sid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if session_pids(sid):
        _signal_all(sid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.05)
