"""`gpuwatch stack up | down | status`: the local Kafka, Redis and Prometheus as a whole,
and with `--kube` a Kubernetes API server (etcd and kube-apiserver)."""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from typing import Any, Literal

from gpuwatch.harness.stack import kafka, prometheus, redis
from gpuwatch.harness.stack import kube as kube_module
from gpuwatch.harness.stack.ports import describe_port_holder, port_in_use
from gpuwatch.harness.stack.processes import (
    exit_code,
    is_ours,
    is_running,
    locked,
    owned_pid,
    read_pid,
    remove_pid,
    spawn,
    stop_all,
    tail,
)
from gpuwatch.harness.stack.service import (
    HOST,
    Daemon,
    Progress,
    ServiceName,
    ServiceState,
    ServiceStatus,
    StackError,
    StackPaths,
    Which,
    format_table,
)
from schemas.settings import ENV_VARS, Settings

__all__ = ["ServiceStatus", "StackError", "daemons", "down", "format_table", "status", "up"]

log = logging.getLogger(__name__)

_POLL_S = 0.25

# The settings (stack group) of each service's ports: Daemon.port, then Daemon.extra_ports.
_PORT_SETTINGS: dict[ServiceName, tuple[str, ...]] = {
    "kafka": ("kafka_port", "kafka_controller_port"),
    "redis": ("redis_port",),
    "prometheus": ("prometheus_port",),
    "etcd": ("etcd_port", "etcd_peer_port"),
    "kube-apiserver": ("kube_port",),
}


def _silent(_: str) -> None:
    return None


def daemons(settings: Settings, which: Which = shutil.which, *, kube: bool = False) -> list[Daemon]:
    """The services of the stack, in the order they are reported: Kafka, Redis and
    Prometheus, then etcd and the API server with `kube` (or stack.kube)."""
    paths = StackPaths.of(settings.stack.state_dir)
    services: list[Any] = [kafka.KafkaService, redis.RedisService, prometheus.PrometheusService]
    if kube or settings.stack.kube:
        services += [kube_module.EtcdService, kube_module.KubeApiServerService]
    return [service(settings, paths, which) for service in services]


def up(
    settings: Settings,
    progress: Progress = _silent,
    *,
    which: Which = shutil.which,
    kube: bool = False,
) -> list[ServiceStatus]:
    """Start what is not running, wait until every service answers; idempotent.

    A service of ours that answers is left alone; a foreign one that answers on the
    port is used as is ("external"); a port held by something that does not answer
    is a StackError. Binaries are checked, Kafka is fetched and formatted and the API
    server built before anything starts, so such failures leave nothing half started.
    A service that needs another (the API server, etcd) starts once that one answers.
    """
    paths = StackPaths.of(settings.stack.state_dir)
    services = daemons(settings, which, kube=kube)
    with locked(paths.lock_file, progress):
        found = {d.name: _assess(d, paths) for d in services}
        to_start = [d for d in services if found[d.name].kind == "free"]
        for d in to_start:
            d.check()
        commands = {d.name: d.prepare(progress) for d in to_start}

        waiting: list[_Waiting] = []
        for d in services:
            seen = found[d.name]
            if seen.kind == "external":
                progress(f"{d.name}: using the one answering on {d.address} (not ours)")
            elif seen.kind == "ours" and seen.pid is not None:
                if seen.answering:
                    progress(f"{d.name} is already up on {d.address} (pid {seen.pid})")
                else:
                    waiting.append(_Waiting(d, seen.pid, offset=None, since=time.monotonic()))
        for wave in _waves(to_start):
            for d in wave:
                progress(f"starting {d.name} on {d.address}...")
                pid, offset = spawn(
                    commands[d.name],
                    cwd=d.workdir,
                    log_path=paths.log(d.name),
                    pid_file=paths.pid_file(d.name),
                )
                waiting.append(_Waiting(d, pid, offset=offset, since=time.monotonic()))
            _wait_ready(waiting, paths, settings.stack.ready_timeout_s, progress)
            waiting = []
        _wait_ready(waiting, paths, settings.stack.ready_timeout_s, progress)
        return [_observe(d, paths) for d in services]


def _waves(to_start: list[Daemon]) -> list[list[Daemon]]:
    """The services to start, in waves: each after the ones it needs have answered."""
    waves: list[list[Daemon]] = []
    pending = list(to_start)
    while pending:
        names = {d.name for d in pending}
        wave = [d for d in pending if not names.intersection(d.needs)]
        if not wave:  # a cycle: a programming error, not a user's
            raise StackError(f"services need each other: {sorted(names)}")
        waves.append(wave)
        pending = [d for d in pending if d not in wave]
    return waves


def down(settings: Settings, progress: Progress = _silent) -> list[ServiceStatus]:
    """Stop the services this state directory started; leave data, logs and others alone."""
    paths = StackPaths.of(settings.stack.state_dir)
    services = [d for d in daemons(settings, kube=True) if _shown(d, paths, settings)]
    with locked(paths.lock_file, progress):
        ours: dict[ServiceName, int] = {}
        for d in services:
            pid = read_pid(paths.pid_file(d.name))
            if pid is not None and is_ours(pid, paths.root):
                ours[d.name] = pid
            elif pid is not None:
                log.info("stale pid file service=%s pid=%d", d.name, pid)
                remove_pid(paths.pid_file(d.name))
        if ours:
            progress(f"stopping {', '.join(ours)}...")
        # What others need stops after them: the API server leaves its lease and its
        # endpoint in etcd as it shuts down, and waits for etcd until it is killed.
        outcome: dict[int, str] = {}
        for wave in reversed(_waves([d for d in services if d.name in ours])):
            outcome |= stop_all({ours[d.name]: d.stop_timeout_s for d in wave})

        statuses: list[ServiceStatus] = []
        for d in services:
            pid = ours.get(d.name)
            if pid is not None:
                how = outcome.get(pid, "did not exit")
                if how == "did not exit":
                    raise StackError(
                        f"{d.name} (pid {pid}) did not exit even after SIGKILL; "
                        f"its pid file {paths.pid_file(d.name)} is kept"
                    )
                remove_pid(paths.pid_file(d.name))
                detail = "stopped" if how == "stopped" else f"killed after {d.stop_timeout_s:.0f} s"
                statuses.append(_status(d, paths, "down", None, f"{detail} (pid {pid})"))
            else:
                seen = _observe(d, paths)
                if seen.state == "external":
                    seen = _status(
                        d, paths, "external", None, "not started by gpuwatch; left running"
                    )
                statuses.append(seen)
        return statuses


def status(settings: Settings) -> list[ServiceStatus]:
    """How each service is now; changes nothing."""
    paths = StackPaths.of(settings.stack.state_dir)
    return [_observe(d, paths) for d in daemons(settings, kube=True) if _shown(d, paths, settings)]


def _shown(d: Daemon, paths: StackPaths, settings: Settings) -> bool:
    """Kafka, Redis and Prometheus always; etcd and the API server when the stack runs
    them (stack.kube) or a pid file says they were started (`stack up --kube`)."""
    optional = d.name in ("etcd", "kube-apiserver")
    return not optional or settings.stack.kube or paths.pid_file(d.name).exists()


@dataclass(frozen=True)
class _Found:
    kind: Literal["ours", "external", "free"]
    pid: int | None = None
    answering: bool = False


@dataclass(frozen=True)
class _Waiting:
    daemon: Daemon
    pid: int
    offset: int | None  # where this start's output begins in the log; None: started earlier
    since: float


def _assess(d: Daemon, paths: StackPaths) -> _Found:
    """Before `up` starts anything: is the service ours, someone else's, or to be started?"""
    pid_file = paths.pid_file(d.name)
    pid = read_pid(pid_file)
    if pid is not None:
        if is_ours(pid, paths.root):
            return _Found("ours", pid, answering=d.probe())
        log.info("stale pid file service=%s pid=%d", d.name, pid)
        remove_pid(pid_file)
    if port_in_use(HOST, d.port):
        if d.probe():
            log.info("external service=%s address=%s", d.name, d.address)
            return _Found("external")
        raise StackError(_port_taken(d, d.port, 0, answers_as=d.name))
    for index, port in enumerate(d.extra_ports, start=1):
        if port_in_use(HOST, port):
            raise StackError(_port_taken(d, port, index, answers_as=None))
    return _Found("free")


def _port_taken(d: Daemon, port: int, index: int, answers_as: ServiceName | None) -> str:
    setting = _PORT_SETTINGS[d.name][index]
    env = next((var for var, key in ENV_VARS.items() if key == ("stack", setting)), None)
    answer = f" and does not answer as {answers_as}" if answers_as else ""
    where = f"stack.{setting}" + (f" ({env})" if env else "")
    return (
        f"cannot start {d.name}: {describe_port_holder(HOST, port)}{answer}. "
        f"Stop that process, or move {d.name} to a free port with {where}."
    )


def _wait_ready(
    waiting: list[_Waiting], paths: StackPaths, timeout_s: float, progress: Progress
) -> None:
    """Poll every started service until it answers; a StackError when one dies or times out."""
    for w in waiting:
        progress(f"waiting for {w.daemon.name} on {w.daemon.address}...")
    pending = list(waiting)
    while pending:
        for w in list(pending):
            d = w.daemon
            if not is_running(w.pid):
                remove_pid(paths.pid_file(d.name))
                code = exit_code(w.pid)
                how = "exited" if code is None else f"exited with code {code}"
                raise StackError(
                    f"{d.name} {how} before it answered on {d.address}; "
                    f"{_log_tail(d.name, paths, w.offset)}"
                )
            if d.probe():
                elapsed = time.monotonic() - w.since
                progress(f"{d.name} is up on {d.address} (pid {w.pid}, {elapsed:.1f} s)")
                log.info("ready service=%s pid=%d elapsed_s=%.1f", d.name, w.pid, elapsed)
                pending.remove(w)
            elif time.monotonic() - w.since > timeout_s:
                stop_all({w.pid: d.stop_timeout_s})
                remove_pid(paths.pid_file(d.name))
                raise StackError(
                    f"{d.name} did not answer on {d.address} within {timeout_s:g} s "
                    f"(stack.ready_timeout_s); stopped it (pid {w.pid}). "
                    f"{_log_tail(d.name, paths, w.offset)}"
                )
        if pending:
            time.sleep(_POLL_S)


def _log_tail(name: ServiceName, paths: StackPaths, offset: int | None) -> str:
    log_path = paths.log(name)
    text = tail(log_path, offset=offset or 0)
    if not text:
        return f"its log {log_path} is empty"
    return f"last lines of {log_path}:\n{text}"


def _observe(d: Daemon, paths: StackPaths) -> ServiceStatus:
    """The state of one service now, from its pid file, its port and its probe."""
    pid = owned_pid(paths.pid_file(d.name), paths.root)
    if pid is not None:
        if d.probe():
            return _status(d, paths, "up", pid, "answering")
        return _status(d, paths, "starting", pid, "running, not answering yet")
    if port_in_use(HOST, d.port):
        if d.probe():
            return _status(d, paths, "external", None, "not started by gpuwatch; answering")
        return _status(d, paths, "down", None, describe_port_holder(HOST, d.port))
    stale = read_pid(paths.pid_file(d.name)) is not None
    return _status(d, paths, "down", None, "not running" + (" (stale pid file)" if stale else ""))


def _status(
    d: Daemon,
    paths: StackPaths,
    state: ServiceState,
    pid: int | None,
    detail: str,
) -> ServiceStatus:
    log_path = paths.log(d.name)
    shown = log_path if state != "external" and log_path.exists() else None
    return ServiceStatus(d.name, state, d.port, pid, shown, detail)
