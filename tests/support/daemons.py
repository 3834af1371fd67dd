"""A local-stack service made of callables, for the manager's tests
(`gpuwatch.harness.stack.Daemon`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuwatch.harness.stack.service import HOST, Progress, ServiceName


@dataclass(frozen=True)
class FakeDaemon:
    """A `Daemon` whose check, prepare and probe are the given functions."""

    name: ServiceName
    port: int
    check: Callable[[], None]
    prepare: Callable[[Progress], list[str]]
    probe: Callable[[], bool]
    workdir: Path
    extra_ports: tuple[int, ...] = ()
    stop_timeout_s: float = 10.0

    @property
    def address(self) -> str:
        """host:port of the listener."""
        return f"{HOST}:{self.port}"
