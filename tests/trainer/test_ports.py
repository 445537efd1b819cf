"""Rendezvous ports (trainer/ports.py): never one the kernel may hand to an outgoing connection.

Before, every launcher's MASTER_PORT came from `bind(("", 0))`, the kernel's ephemeral range; a
CI run failed its first launch on EADDRINUSE when a connection took the port before rank 0 bound
it (tests/suite/test_faults.py[zero1], the restart then hid it as a second attempt)."""
from __future__ import annotations

import socket

from shardbench.suite.backends import local
from shardbench.trainer import dist_env, ports


def test_the_local_backend_draws_rendezvous_ports_outside_the_ephemeral_range():
    low, high = ports.ephemeral_range()
    drawn = {local.free_port() for _ in range(200)}
    assert not [p for p in drawn if low <= p <= high], (low, high)
    assert len(drawn) > 150  # drawn at random, not one port for every caller
    assert dist_env.free_port is ports.free_port  # the trainer's own (mpirun on one host without MASTER_*)


def test_an_outgoing_connection_never_gets_a_drawn_port():
    """What the range buys: 300 connections the kernel numbers itself, none on a drawn port."""
    drawn = {ports.free_port("127.0.0.1") for _ in range(300)}
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(512)
        clients = [socket.create_connection(server.getsockname()) for _ in range(300)]
        try:
            taken = {c.getsockname()[1] for c in clients}
        finally:
            for c in clients:
                c.close()
    assert not drawn & taken


def test_a_port_in_use_is_never_drawn_and_no_room_falls_back_to_the_kernel():
    only_lowest = (ports.LOWEST + 1, 65535)  # a range that leaves one port outside it: LOWEST
    assert ports.free_port("127.0.0.1", ephemeral=only_lowest) == ports.LOWEST
    with socket.socket() as held:
        held.bind(("127.0.0.1", ports.LOWEST))
        fallback = ports.free_port("127.0.0.1", ephemeral=only_lowest)
    assert fallback != ports.LOWEST and fallback > 0
    assert ports.ephemeral_range()[0] > ports.LOWEST  # this machine leaves room below its range
