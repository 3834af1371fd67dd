"""Free loopback ports for servers a test starts."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nobody listens on now (closed again: a server of the test binds it)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` different loopback ports nobody listens on now (all held until all are picked)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
