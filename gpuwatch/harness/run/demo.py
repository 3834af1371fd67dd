"""`gpuwatch demo`: the whole product on one machine, from the stack to the live view.

Starts what is missing of the local stack, creates the topics, runs the worker and a
simulated cluster (`gpuwatch simulate`) as child processes with their logs in the stack's
log directory, and shows `gpuwatch top` until Ctrl-C or `--duration`. Then it stops the
children it started (SIGTERM, then SIGKILL after a grace period) and the stack if it
started it, and says where everything was. With `kube`, the stack runs its kube-apiserver
too and the simulated cluster lives there (`gpuwatch simulate --kube`), for kubectl to see.

However it ends, nothing it started outlives it: SIGTERM and SIGHUP end it as Ctrl-C
does; an output nobody reads any more (`gpuwatch demo | tee demo.log`, the `tee` gone
with the Ctrl-C) ends it too, and a message that cannot be written never skips a stop;
and each child is told by the kernel to stop when the demo dies, even by SIGKILL
(Linux's parent-death signal), so a killed test run leaves no worker or simulator behind.
"""

from __future__ import annotations

import errno
import io
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO, cast

from gpuwatch import kafka
from gpuwatch.harness.stack import kube as stack_kube
from gpuwatch.harness.stack import manager
from gpuwatch.harness.stack.service import StackPaths
from gpuwatch.run.lifetime import PARENT_ENV
from gpuwatch.top.live import TopOptions, TopUnavailable
from gpuwatch.top.live import run as run_top
from schemas.settings import Settings
from sinks.redis.sink import redact_url

__all__ = ["DemoError", "DemoOptions", "clock_skew_s", "demo_env", "run", "where_to_look"]

UNBOUNDED_HORIZON_S = 3600.0  # a fast demo without --duration meets the wall clock after this
MAX_CLOCK_SKEW_S = 86_400  # the most GPUWATCH_MAX_CLOCK_SKEW_S takes: a day
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that end the demo as Ctrl-C does (a service manager, a closed terminal)."""
STOP_GRACE_S = 30.0  # the worker commits and leaves its group on SIGTERM within seconds
DEMO_RULES = {
    # The defaults suit a cluster (stalled after 5 min, queued alert after 10 min); the demo
    # shortens them so that a few minutes show every state and alert. The user's own
    # GPUWATCH_* settings win.
    "GPUWATCH_STALL_AFTER_S": "120",
    "GPUWATCH_QUEUED_ALERT_AFTER_S": "180",
    "GPUWATCH_IDLE_ALERT_AFTER_S": "60",
}


class DemoError(Exception):
    """The demo cannot go on; the message says why and what to do."""


@dataclass(frozen=True)
class DemoOptions:
    """What `gpuwatch demo` was asked for."""

    scenario: str = "small"
    speed: float = 1.0
    duration_s: float | None = None
    ui: bool = True
    keep_stack: bool = False
    interval_s: float = 2.0
    clusters: tuple[str, ...] = ()
    """Simulated clusters, each its own `gpuwatch simulate --cluster NAME` with the same
    scenario (the same node and pod names, uids and GPU uuids of its own); none: one
    simulated cluster of the settings' cluster."""
    kube: bool = False
    """The stack with its kube-apiserver, and the simulated cluster written to it (one
    cluster: several would write the same pods)."""


@dataclass
class Child:
    """A process the demo started."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path


def demo_env(settings: Settings, options: DemoOptions | None = None) -> dict[str, str]:
    """The environment of the demo's children: ours, the demo's rules under the user's, and
    a clock skew that covers how far simulated time runs ahead of the wall clock."""
    env = dict(os.environ)
    for name, value in DEMO_RULES.items():
        env.setdefault(name, value)
    skew = None if options is None else clock_skew_s(options, settings.windows.max_clock_skew_s)
    if skew is not None:
        env.setdefault("GPUWATCH_MAX_CLOCK_SKEW_S", str(skew))
    env["GPUWATCH_KAFKA_BOOTSTRAP"] = settings.kafka.bootstrap
    env["GPUWATCH_TOPIC_PREFIX"] = settings.kafka.topic_prefix
    env["GPUWATCH_APP_ID"] = settings.kafka.app_id
    env["GPUWATCH_KAFKA_PARTITIONS"] = str(settings.kafka.partitions)
    env["GPUWATCH_REDIS_URL"] = settings.redis.url.get_secret_value()
    env["GPUWATCH_METRICS_PORT"] = str(settings.metrics.port)
    env["GPUWATCH_SINK_METRICS_PORT"] = str(settings.sink.metrics_port)
    env["GPUWATCH_SINK_EXPORTER_PORT"] = str(settings.sink.exporter_port)
    return env


def epoch_for(options: DemoOptions, now: float) -> float:
    """Event time of the simulation's start.

    Faster than real time, the simulation starts in the past so that its event time meets
    the wall clock at the end of the run (an hour when it has no end), so ages and lags
    read naturally and event time does not run far ahead of the clock; at speed 1 it
    starts now. (On a real API server, `kube`, the simulator is given none: it starts
    when the simulator does, as the server stamps a pod's creation with its wall clock
    and a pod's start must not come before it.)
    """
    if options.speed <= 1:
        return now
    horizon = UNBOUNDED_HORIZON_S if options.duration_s is None else options.duration_s
    return now - (options.speed - 1) * horizon


def clock_skew_s(options: DemoOptions, skew_s: int) -> int | None:
    """The worker's clock skew that takes all the simulated run's data, where `skew_s`
    (the settings') does not; None where it does.

    Above speed 1 simulated time runs ahead of the wall clock by (speed - 1) seconds a
    second from where it meets it: at once on a real API server (`kube`, the simulation
    starts now), after its hour without `--duration` (`epoch_for`), never with it. The
    worker dead-letters data further ahead than its clock skew, so the demo's worker gets
    the lead of the whole run plus the usual skew, at most a day (the setting's maximum):
    a faster or longer run than that loses its data past a day ahead.
    """
    if options.speed <= 1 or (options.duration_s is not None and not options.kube):
        return None
    if options.duration_s is None:
        wanted = MAX_CLOCK_SKEW_S
    else:
        lead_s = math.ceil((options.speed - 1) * options.duration_s)
        wanted = min(MAX_CLOCK_SKEW_S, lead_s + skew_s)
    return wanted if wanted > skew_s else None


def where_to_look(settings: Settings, logs: Path, *, kube: bool = False) -> str:
    """What the user can open while the demo runs (`kube`: kubectl on the stack's API
    server too)."""
    prom = f"http://127.0.0.1:{settings.stack.prometheus_port}"
    prefix = "gpuwatch:"
    return "\n".join(
        [
            "gpuwatch demo is running. Where to look:",
            f"  Prometheus   {prom}/alerts  (alerts firing)   {prom}/graph",
            "    sum by (namespace) (gpuwatch_waste_usd_total)      waste so far by namespace",
            '    gpuwatch_pod_state{state="stalled"} == 1           pods holding a GPU idle',
            f"  Redis        redis-cli -u {redact_url(settings.redis.url.get_secret_value())}",
            f"    ZRANGE {prefix}state:stalled 0 -1    HGETALL {prefix}pod:<uid>",
            f"    ZREVRANGE {prefix}waste:pods 0 9 WITHSCORES    HGETALL {prefix}alerts:firing",
            f"  Metrics      http://{settings.metrics.bind}:{settings.sink.exporter_port}/metrics"
            f" (pods and GPUs), :{settings.metrics.port} (worker: pipeline, alerts),"
            f" :{settings.sink.metrics_port} (Redis sink), :{settings.agent.metrics_port} (node"
            f" agents), :{settings.watcher.metrics_port} (watcher)",
            "  Live view    gpuwatch top   (another terminal; `--once` prints and exits)",
            *(_kubectl(settings) if kube else []),
            f"  Logs         {logs}/demo-worker.log  {logs}/demo-sink.log"
            f"  {logs}/demo-metrics.log  {logs}/demo-simulate*.log",
            "Ctrl-C stops the demo.",
        ]
    )


def _kubectl(settings: Settings) -> list[str]:
    config = stack_kube.admin_kubeconfig(settings)
    return [
        f"  Kubernetes   kubectl --kubeconfig {config} get pods -A -w",
        f"    the simulated cluster on the stack's kube-apiserver {stack_kube.api_url(settings)}"
        " (its pods, nodes, ReplicaSets and Jobs)",
    ]


class Viewer(io.TextIOBase):
    """The demo's output: once nobody reads it (a broken pipe), the demo ends as at Ctrl-C
    (`KeyboardInterrupt`, once), and what is written afterwards goes nowhere."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out
        self.gone = False

    def write(self, text: str) -> int:
        return self._do(lambda: self.out.write(text), len(text))

    def flush(self) -> None:
        self._do(self.out.flush, 0)

    def isatty(self) -> bool:
        return not self.gone and self.out.isatty()

    def _do(self, action: Callable[[], object], done: int) -> int:
        if self.gone:
            return done
        try:
            action()
        except OSError as exc:
            if not isinstance(exc, BrokenPipeError) and exc.errno != errno.EPIPE:
                raise
            self.gone = True
            raise KeyboardInterrupt from exc  # nobody watches: stop as at Ctrl-C
        return done


def quiet(progress: Callable[[str], None]) -> Callable[[str], None]:
    """`progress` that never raises for an output gone: a message must not skip a stop."""

    def say(message: str) -> None:
        with suppress(OSError):
            progress(message)

    return say


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt meanwhile (in the main thread only, where
    Python runs handlers), so every `finally` of the demo runs as at Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    before = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def run(
    settings: Settings,
    options: DemoOptions,
    out: TextIO = sys.stdout,
    progress: Callable[[str], None] = lambda message: None,
) -> int:
    """The demo; its exit status."""
    with stop_signals_interrupt():
        # A text stream in all but its type: TextIOBase is not TextIO to the checker.
        return _run(settings, options, cast(TextIO, Viewer(out)), quiet(progress))


def _run(
    settings: Settings, options: DemoOptions, out: TextIO, progress: Callable[[str], None]
) -> int:
    before = {s.name for s in manager.status(settings) if s.healthy}
    progress(
        "starting the local stack (the first run downloads Kafka, about 100 MB"
        + (", and builds the kube-apiserver, minutes)" if options.kube else ")")
    )
    statuses = manager.up(settings, progress, kube=options.kube)
    bad = [s for s in statuses if not s.healthy]
    if bad:
        raise DemoError(
            "the stack did not come up: " + ", ".join(f"{s.name}: {s.detail}" for s in bad)
        )
    started_stack = {s.name for s in statuses} - before
    try:
        progress("creating the topics")
        report = kafka.create_topics(settings)
        if not all(row.ok for row in report):
            raise DemoError("topics not created:\n" + kafka.format_report(report))
        logs = StackPaths.of(settings.stack.state_dir).root / "logs"
        with children(settings, options, logs, progress) as running:
            out.write(where_to_look(settings, logs, kube=options.kube) + "\n")
            out.flush()
            return _show(settings, options, running, out)
    finally:
        if started_stack and not options.keep_stack:
            progress("stopping the stack the demo started (keep it: --keep-stack)")
            manager.down(settings, progress)


@contextmanager
def children(
    settings: Settings, options: DemoOptions, logs: Path, progress: Callable[[str], None]
) -> Iterator[list[Child]]:
    """The worker, the sinks and the simulator, running; stopped on the way out, whatever
    happens."""
    env = demo_env(settings, options)
    exe = [sys.executable, "-m", "gpuwatch.cli"]
    sim = [*exe, "simulate", "--scenario", options.scenario, "--speed", f"{options.speed:g}"]
    if options.kube:
        sim += ["--kube"]  # event time starts when it does: see epoch_for
    else:
        sim += ["--epoch", f"{epoch_for(options, time.time()):.3f}"]
    # The first simulated cluster serves the agents' and the watcher's /metrics on their
    # ports; the others would want the same ports.
    sims = [
        (f"simulate-{name}", [*sim, "--cluster", name, *(["--no-metrics"] if i else [])])
        for i, name in enumerate(options.clusters)
    ] or [("simulate", sim)]
    running: list[Child] = []
    try:
        progress("starting the worker")
        running.append(_spawn("worker", [*exe, "worker"], env, logs))
        progress("starting the sinks (Redis, metrics)")
        running.append(_spawn("sink", [*exe, "sink", "redis"], env, logs))
        running.append(_spawn("metrics", [*exe, "sink", "metrics"], env, logs))
        names = ", ".join(options.clusters)
        progress(
            f"starting the simulated clusters {names} (scenario {options.scenario} each)"
            if options.clusters
            else f"starting the simulated cluster (scenario {options.scenario})"
        )
        for name, argv in sims:
            running.append(_spawn(name, argv, env, logs))
        yield running
    finally:
        quiet(progress)("stopping the worker, the sinks and the simulated cluster")
        stop(running)


def _spawn(name: str, argv: Sequence[str], env: dict[str, str], logs: Path) -> Child:
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / f"demo-{name}.log"
    with path.open("ab") as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the demo only; it stops them in order
            env={**env, PARENT_ENV: str(os.getpid())},  # and it stops when the demo dies
        )  # fmt: skip
    return Child(name, process, path)


def stop(running: Sequence[Child], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the children (the simulator first), wait, SIGKILL what is left."""
    for child in reversed(running):
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in reversed(running):
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def _show(settings: Settings, options: DemoOptions, running: list[Child], out: TextIO) -> int:
    """The live view (or quiet waiting) until Ctrl-C, the duration, or a child's death."""
    deadline = None if options.duration_s is None else time.monotonic() + options.duration_s

    def sleep(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for child in running:
                if child.process.poll() is not None:
                    raise DemoError(
                        f"the {child.name} exited with status {child.process.returncode}; "
                        f"its log: {child.log}"
                    )
            if deadline is not None and time.monotonic() >= deadline:
                raise KeyboardInterrupt  # the view's own way out
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    top = TopOptions(interval_s=options.interval_s, once=not options.ui)
    try:
        if options.ui:
            return _top(settings, top, out, sleep)
        while True:
            sleep(3600.0)
    except KeyboardInterrupt:
        pass
    if not options.ui:
        _top(settings, TopOptions(once=True), out, sleep)
    return 0


def _top(
    settings: Settings, options: TopOptions, out: TextIO, sleep: Callable[[float], None]
) -> int:
    try:
        return run_top(settings.redis, options, out, sleep=sleep)
    except TopUnavailable as exc:
        raise DemoError(str(exc)) from exc
