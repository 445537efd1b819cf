"""Rendezvous ports. A port the kernel picks (`bind(("", 0))`) comes from its ephemeral range,
the same range it hands to every outgoing connection on the machine. Between picking a port and
rank 0 binding it (a launcher's start and torch's import: seconds) any connection may take it,
and the run fails on EADDRINUSE before its first step (seen in CI: a gloo connection of a run
beside it). Ports are therefore drawn outside that range, where only explicit binds land, and
checked free."""
from __future__ import annotations

import random
import socket

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
LINUX_DEFAULT_RANGE = (32768, 60999)
LOWEST = 20000
"""Ports below are left to services (databases, registries, the common dev ports)."""


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections (Linux's default where it cannot be read)."""
    try:
        with open(EPHEMERAL_RANGE) as fh:
            low, high = (int(v) for v in fh.read().split())
        return low, high
    except (OSError, ValueError):
        return LINUX_DEFAULT_RANGE


def free_port(host: str = "", ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port nothing is bound to now and no outgoing connection will be given; the kernel's
    own pick when the ephemeral range leaves no such port."""
    low, high = ephemeral or ephemeral_range()
    pool = [*range(LOWEST, low), *range(max(high + 1, LOWEST), 65536)]
    draw = random.SystemRandom()  # not `random`: forked processes share its state and would draw alike
    for _ in range(100 if pool else 0):
        port = draw.choice(pool)
        if _bindable(host, port):
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
