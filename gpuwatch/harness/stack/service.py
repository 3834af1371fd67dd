"""What every local-stack service shares: its description, its status, its paths, its errors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import ClassVar, Literal, Protocol

from gpuwatch.tables import table_lines


def packaged(name: str) -> Path:
    """A file the stack runs on, shipped as package data in gpuwatch/harness/stack/files/.

    Each is one source kept where the deployment needs it (deploy/prometheus/, scripts/):
    in a checkout, files/ holds links to them and the path resolves to the source; in an
    installed wheel, the copy setuptools made. A wheel installs as files on disk, so the
    resource is a path Prometheus and bash can be pointed at.
    """
    return Path(str(files("gpuwatch.harness.stack").joinpath("files", name))).resolve()


ServiceName = Literal["kafka", "redis", "prometheus", "etcd", "kube-apiserver"]
ServiceState = Literal["up", "down", "external", "starting"]
Progress = Callable[[str], None]
Which = Callable[[str], str | None]

HOST = "127.0.0.1"  # the local stack never listens beyond loopback


class StackError(Exception):
    """The local stack cannot be brought to the asked state; the message says what to do."""


@dataclass(frozen=True)
class ServiceStatus:
    """One service as `gpuwatch stack` reports it."""

    name: ServiceName
    state: ServiceState
    port: int
    pid: int | None
    log: Path | None
    detail: str

    @property
    def healthy(self) -> bool:
        """Up, or an external service that answers: usable by gpuwatch."""
        return self.state in ("up", "external")


@dataclass(frozen=True)
class StackPaths:
    """The layout of the state directory: one folder per service, logs, pid files."""

    root: Path

    @classmethod
    def of(cls, state_dir: Path) -> StackPaths:
        """Absolute paths, so a process's command line can be matched against them."""
        return cls(state_dir.expanduser().resolve())

    def service_dir(self, name: ServiceName) -> Path:
        """Data and rendered configuration of one service."""
        return self.root / name

    def log(self, name: ServiceName) -> Path:
        """stdout and stderr of one service."""
        return self.root / "logs" / f"{name}.log"

    def pid_file(self, name: ServiceName) -> Path:
        """The pid of the running service, while gpuwatch runs it."""
        return self.root / "run" / f"{name}.pid"

    @property
    def lock_file(self) -> Path:
        """Held while `stack up` or `stack down` runs, so two do not race."""
        return self.root / "run" / "stack.lock"


class Daemon(Protocol):
    """How to check, prepare, start and probe one service of the stack.

    `check` raises StackError when a binary or a file the service needs is missing;
    `prepare` fetches, renders and formats what the service needs and returns its
    command line; `probe` asks the service once whether it answers (a few seconds
    at most), which is what both `up` and `status` mean by "up".
    """

    @property
    def name(self) -> ServiceName:
        """The service."""

    @property
    def port(self) -> int:
        """Its listener's port."""

    @property
    def extra_ports(self) -> tuple[int, ...]:
        """Other ports it listens on (Kafka's controller)."""

    @property
    def needs(self) -> tuple[ServiceName, ...]:
        """Services that must answer before it starts (the API server's etcd)."""

    @property
    def workdir(self) -> Path:
        """Its data and rendered configuration; the process's working directory."""

    @property
    def stop_timeout_s(self) -> float:
        """Seconds between SIGTERM and SIGKILL."""

    @property
    def address(self) -> str:
        """host:port of the service's listener."""

    def check(self) -> None:
        """A StackError when a binary or a file the service needs is missing."""

    def prepare(self, progress: Progress) -> list[str]:
        """Fetch, render and format what the service needs; its command line."""

    def probe(self) -> bool:
        """Whether the service answers now (a few seconds at most)."""


class LocalService(ABC):
    """One service of the stack in one state directory: a `Daemon` for the manager.

    A subclass names the service, its ports and its stop timeout, and says how to
    check, prepare and probe it.
    """

    name: ClassVar[ServiceName]
    stop_timeout_s: ClassVar[float] = 10.0
    needs: ClassVar[tuple[ServiceName, ...]] = ()

    def __init__(
        self, paths: StackPaths, which: Which, port: int, extra_ports: tuple[int, ...] = ()
    ) -> None:
        self.which = which
        self.port = port
        self.extra_ports = extra_ports
        self.home = paths.service_dir(self.name)

    @property
    def workdir(self) -> Path:
        """Data and rendered configuration of the service (its working directory)."""
        return self.home

    @property
    def address(self) -> str:
        """host:port of the service's listener."""
        return f"{HOST}:{self.port}"

    @abstractmethod
    def check(self) -> None:
        """A StackError when a binary or a file the service needs is missing."""

    @abstractmethod
    def prepare(self, progress: Progress) -> list[str]:
        """Fetch, render and format what the service needs; its command line."""

    @abstractmethod
    def probe(self) -> bool:
        """Whether the service answers now (a few seconds at most)."""


def format_table(statuses: Sequence[ServiceStatus]) -> str:
    """The services, one per line, as a table for the terminal (and `grep`)."""
    header = ("SERVICE", "STATE", "ADDRESS", "PID", "DETAIL", "LOG")
    rows = [
        (
            s.name,
            s.state,
            f"{HOST}:{s.port}",
            "-" if s.pid is None else str(s.pid),
            s.detail or "-",
            "-" if s.log is None else str(s.log),
        )
        for s in statuses
    ]
    return "\n".join(table_lines(header, rows))
