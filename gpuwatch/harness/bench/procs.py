"""The processes `gpuwatch bench` starts and watches: workers, the Redis sink, their /proc.

Each runs as `python -m gpuwatch.cli ...` with the bench's settings in its environment, its
log in a file. RSS and CPU come from /proc, so measuring costs the process nothing; the
same reading gives the broker's CPU when its pid is known (the local stack's Kafka).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from schemas.settings import Settings

__all__ = [
    "LIVENESS_FAILURES",
    "LIVENESS_PERIOD_S",
    "BenchProcess",
    "SinkProcess",
    "WorkerProcess",
    "broker_pid",
    "free_port",
    "metrics_counter",
    "proc_cpu_s",
    "stop_all",
    "supervised",
    "worker_env",
]

MB = 1 << 20
STOP_DEADLINE_S = 40.0  # the worker commits and exits on SIGTERM within its own 25 s bound
PAUSED_SESSION_S = 90  # the worker is paused while the backlog is produced: Faust's longest
# The worker's liveness probe as deploy/helm/gpuwatch/templates/_consumer.tpl has it.
LIVENESS_PERIOD_S = 20.0
LIVENESS_TIMEOUT_S = 10.0
LIVENESS_FAILURES = 3

# No proxies: an http_proxy in the environment must not swallow requests to loopback.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def worker_env(
    settings: Settings, redis_url: str, *, metrics_port: int | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a bench process on the bench's topics, app id and Redis.

    `extra` adds or overrides variables (GPUWATCH_IDLE_ALERT_AFTER_S=...).
    """
    kafka = settings.kafka
    return {
        **os.environ,
        "GPUWATCH_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUWATCH_APP_ID": kafka.app_id,
        "GPUWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUWATCH_KAFKA_PARTITIONS": str(kafka.partitions),
        "GPUWATCH_REDIS_URL": redis_url,
        "GPUWATCH_METRICS_PORT": str(metrics_port or free_port()),
        "GPUWATCH_WORKER_SINKS": "true",
        **extra,
    }


def proc_cpu_s(pid: int) -> float:
    """CPU seconds of a process, all threads, so far (utime + stime of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(settings: Settings) -> int | None:
    """The local stack's Kafka pid when this user can read its /proc, else None."""
    from gpuwatch.harness.stack import manager

    try:
        found = [s.pid for s in manager.status(settings) if s.name == "kafka"]
    except (OSError, RuntimeError):
        return None
    pid = found[0] if found else None
    if pid is None:
        return None
    try:
        proc_cpu_s(pid)
    except (OSError, ValueError, IndexError):
        return None
    return pid


class BenchProcess:
    """A `python -m gpuwatch.cli` process, its log in a file; its RSS and CPU from /proc."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gpuwatch.cli", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._peak_mb = 0.0

    @property
    def pid(self) -> int:
        """The process id."""
        return self.process.pid

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's log."""
        return self.log_path.read_text(errors="replace")[-chars:]

    def check(self) -> None:
        """Raise if the process exited."""
        if self.process.poll() is not None:
            code = self.process.returncode
            raise RuntimeError(f"the {self.name} exited ({code}):\n{self.log_tail()}")

    def _status_mb(self, field: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024 / MB  # kB
        raise RuntimeError(f"no {field} in /proc/{self.pid}/status")

    def rss_mb(self) -> float:
        """Resident memory now (VmRSS)."""
        rss = self._status_mb("VmRSS")
        self._peak_mb = max(self._peak_mb, rss)
        return rss

    def peak_mb(self) -> float:
        """The most resident memory the process has had (VmHWM)."""
        return max(self._peak_mb, self._status_mb("VmHWM"))

    def cpu_s(self) -> float:
        """CPU seconds of the process, all threads, so far."""
        return proc_cpu_s(self.pid)

    def vm_peak_mb(self) -> float:
        """The most address space the process has had mapped (VmPeak)."""
        return self._status_mb("VmPeak")

    def limit_address_space(self, limit_bytes: int) -> None:
        """Cap the process's address space (RLIMIT_AS, soft and hard, through prlimit(2)):
        past it an allocation fails, as in a container whose memory limit is reached. A
        process of this user may lower its child's limits; no cgroup is needed."""
        resource.prlimit(self.pid, resource.RLIMIT_AS, (limit_bytes, limit_bytes))

    def kill(self) -> None:
        """SIGKILL (a liveness probe failed), and reap it."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def pause(self) -> None:
        """Stop the process (SIGSTOP)."""
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused process go on (SIGCONT)."""
        self.process.send_signal(signal.SIGCONT)

    def terminate(self) -> None:
        """SIGTERM (after SIGCONT, should it be paused), unless it exited."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)

    def reap(self) -> None:
        """Wait for the process to exit; SIGKILL past the deadline."""
        try:
            self.process.wait(timeout=STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        """SIGTERM, SIGKILL past the deadline."""
        self.terminate()
        self.reap()


class WorkerProcess(BenchProcess):
    """`gpuwatch worker` with its /metrics; paused, it keeps its partitions for 90 s."""

    def __init__(
        self,
        settings: Settings,
        redis_url: str,
        log_path: Path,
        *,
        instance: str = "bench",
        **extra: str,
    ) -> None:
        self.metrics_port = free_port()
        args = ["worker", "--instance", instance, "--session-timeout", str(PAUSED_SESSION_S)]
        env = worker_env(settings, redis_url, metrics_port=self.metrics_port, **extra)
        super().__init__(f"worker {instance}", args, env, log_path)

    def live(self) -> bool:
        """Whether its /livez answers 200 within the chart's probe timeout (Kubernetes
        restarts it after `LIVENESS_FAILURES` failures in a row)."""
        url = f"http://127.0.0.1:{self.metrics_port}/livez"
        try:
            with _OPENER.open(url, timeout=LIVENESS_TIMEOUT_S) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False


class SinkProcess(BenchProcess):
    """`gpuwatch sink redis`, its /metrics on a port of its own."""

    def __init__(self, settings: Settings, redis_url: str, log_path: Path) -> None:
        self.metrics_port = free_port()
        env = worker_env(
            settings,
            redis_url,
            metrics_port=free_port(),
            GPUWATCH_SINK_METRICS_PORT=str(self.metrics_port),
        )
        super().__init__("redis sink", ["sink", "redis"], env, log_path)

    def counter(self, name: str) -> int | None:
        """A counter of its /metrics (no labels), None when it does not answer or lacks it."""
        return metrics_counter(self.metrics_port, name)

    def serving(self) -> bool:
        """Whether its /metrics answers (it serves once its topics are checked)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with _OPENER.open(url, timeout=2) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False


def metrics_counter(port: int, name: str) -> int | None:
    """A sample without labels of the /metrics on a local port, as an integer; None when
    the endpoint does not answer or has no such sample."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        with _OPENER.open(url, timeout=2) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError, ValueError):
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and not sample.labels:
                return int(sample.value)
    return None


def stop_all(processes: list[BenchProcess]) -> None:
    """Ask every process to stop at once (SIGTERM), then wait for each in turn."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.reap()


@contextmanager
def supervised(processes: list[BenchProcess]) -> Iterator[None]:
    """Stop the processes at the end; on an error, write their logs' ends to stderr first."""
    try:
        yield
    except BaseException:
        for process in processes:
            sys.stderr.write(f"--- {process.name}:\n{process.log_tail()}")
        raise
    finally:
        stop_all(processes)
