"""Whether a local TCP port is taken, and by which process, read from /proc."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


@dataclass(frozen=True)
class PortHolder:
    """A process holding a listening socket."""

    pid: int
    command: str


def port_in_use(host: str, port: int) -> bool:
    """True when a listener already holds `port` on `host` (or on every address).

    Binding is the question the service will ask itself. With SO_REUSEADDR, as Kafka,
    Redis and Prometheus set it, a port left in TIME_WAIT is not reported as taken.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def listening_inodes(port: int, proc: Path = Path("/proc")) -> set[int]:
    """Inodes of the TCP sockets listening on `port`, IPv4 and IPv6."""
    inodes: set[int] = set()
    for table in ("tcp", "tcp6"):
        try:
            text = (proc / "net" / table).read_text(encoding="ascii")
        except OSError:
            continue
        inodes |= parse_listening_inodes(text, port)
    return inodes


def parse_listening_inodes(table: str, port: int) -> set[int]:
    """Inodes of listening sockets on `port` in the text of /proc/net/tcp or tcp6."""
    inodes: set[int] = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != _LISTEN:
            continue
        _, _, port_hex = fields[1].rpartition(":")
        if int(port_hex, 16) == port:
            inodes.add(int(fields[9]))
    return inodes


def port_holder(port: int, proc: Path = Path("/proc")) -> PortHolder | None:
    """The process listening on `port`, when /proc lets us see it (our own, or all as root)."""
    inodes = listening_inodes(port, proc)
    if not inodes:
        return None
    targets = {f"socket:[{inode}]" for inode in inodes}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                if os.readlink(fd) in targets:
                    return PortHolder(int(entry.name), _command(entry))
    return None


def describe_port_holder(host: str, port: int) -> str:
    """A sentence for an error message: who holds the port, as far as we can tell."""
    holder = port_holder(port)
    if holder is None:
        return f"port {port} on {host} is in use by another process not started by gpuwatch"
    return (
        f"port {port} on {host} is in use by pid {holder.pid} ({holder.command}), "
        "a process not started by gpuwatch"
    )


def _command(proc_entry: Path) -> str:
    try:
        raw = (proc_entry / "cmdline").read_bytes()
    except OSError:
        return "?"
    command = " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)
    return command if len(command) <= 120 else command[:117] + "..."
