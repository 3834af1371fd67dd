"""The processes of `gpuwatch replay --rerun`: the worker and the Redis sink, started on the
rerun's prefix, watched until they have caught up, stopped.

The worker has caught up when its consumer group has committed the end offset of every
input partition (the copied inputs and the internal pod.usage), and no offset of the
inputs, the outputs or the group has moved for `SETTLE_S`, so the ticks that close the last
windows have gone by. The sink has caught up when its group has committed the end offset
of every derived topic it writes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gpuwatch.kafka import KafkaError, TopicPartition, admin, consumer
from gpuwatch.replay.read import Progress
from schemas import ALL_TOPICS, K8S_NODES, K8S_PODS, NVML_SAMPLES, POD_USAGE, TopicSpec
from schemas.settings import Settings
from schemas.topics import SINK_TOPICS
from sinks.redis.writer import redis_group

__all__ = [
    "DERIVED",
    "INPUTS",
    "WorkerRunError",
    "forget_group",
    "log_path",
    "sigterm_interrupts",
    "spawn",
    "spawn_sink",
    "stop",
    "wait_caught_up",
    "wait_sink_caught_up",
]

SETTLE_S = 4.0  # longer than the worker's commit interval (2.8 s) and several ticks (0.5 s)
STALL_S = 120.0  # no offset moved for two minutes while inputs are left: the worker is stuck
STOP_S = 30.0  # the worker commits and leaves its group on SIGTERM within seconds
WORKER_TICK_S = "0.5"  # ticks close the last windows once the inputs are consumed
INPUTS: tuple[TopicSpec[Any], ...] = (NVML_SAMPLES, K8S_PODS, K8S_NODES)
"""What a rerun copies, in the order it copies them."""
DERIVED: tuple[TopicSpec[Any], ...] = tuple(spec for spec in ALL_TOPICS if spec not in INPUTS)
"""What the worker writes under the rerun's prefix: every other topic."""


class WorkerRunError(Exception):
    """The worker did not start, stopped early or stopped making progress."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def log_path(log_dir: Path | None, target: Settings, process: str = "") -> Path:
    """Where the worker (or another `process`) of a rerun logs: `log_dir`, else the
    temporary directory."""
    directory = log_dir or Path(tempfile.gettempdir())
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"gpuwatch-replay-{target.kafka.app_id}{process and '-'}{process}.log"


def spawn(
    target: Settings, redis_url: str, config: Path | None, log: Path, input_end_ms: int | None
) -> Any:
    """`gpuwatch worker` on the target prefix; the other settings come from our environment.

    With `input_end_ms` the worker knows where the copied input ends, and closes every
    window up to it once it has caught up, instead of waiting for data that never comes.
    """
    env = _env(target, redis_url, config)
    if input_end_ms is not None:
        env["GPUWATCH_WORKER_INPUT_END_MS"] = str(input_end_ms)
    argv = [sys.executable, "-m", "gpuwatch.cli", "worker", "--tick-interval", WORKER_TICK_S]
    return _popen([*argv, "--instance", "replay"], env, log)


def spawn_sink(target: Settings, redis_url: str, config: Path | None, log: Path) -> Any:
    """`gpuwatch sink redis` on the target prefix, writing the rerun's Redis database."""
    env = _env(target, redis_url, config)
    env["GPUWATCH_SINK_METRICS_PORT"] = str(_free_port())
    return _popen([sys.executable, "-m", "gpuwatch.cli", "sink", "redis"], env, log)


def _env(target: Settings, redis_url: str, config: Path | None) -> dict[str, str]:
    kafka = target.kafka
    env = {
        **os.environ,
        "GPUWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "GPUWATCH_TOPIC_PREFIX": kafka.topic_prefix,
        "GPUWATCH_APP_ID": kafka.app_id,
        "GPUWATCH_KAFKA_PARTITIONS": str(kafka.partitions),
        "GPUWATCH_REDIS_URL": redis_url,
        "GPUWATCH_METRICS_PORT": str(_free_port()),
    }
    if config is not None:
        env["GPUWATCH_CONFIG"] = str(config)
    return env


def _popen(argv: list[str], env: dict[str, str], log: Path) -> Any:
    with log.open("wb") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us only; we stop the worker in order
        )


def wait_sink_caught_up(target: Settings, sink: Any, log: Path) -> None:
    """Until the Redis sink's group has committed the end of every derived topic it writes."""
    kafka = target.kafka
    names = [spec.full_name(kafka.topic_prefix) for spec in SINK_TOPICS]
    tps = [TopicPartition(name, p) for name in names for p in range(kafka.partitions)]
    reader = consumer(kafka, enable_auto_commit=False)
    client = admin(kafka)
    try:
        ends = {tp: end for tp, end in reader.end_offsets(tps).items() if end > 0}
        group = redis_group(target)
        last, moved = -1, time.monotonic()
        while True:
            if sink.poll() is not None:
                raise _exited("Redis sink", sink, log)
            done = _committed(client, group)
            left = sum(max(0, end - done.get(tp, 0)) for tp, end in ends.items())
            if not left:
                return
            if left != last:
                last, moved = left, time.monotonic()
            elif time.monotonic() - moved > STALL_S:
                raise _stalled("Redis sink", f"{left} records", log)
            time.sleep(0.5)
    except KafkaError as exc:
        raise WorkerRunError(f"watching the Redis sink's progress failed: {exc!r}") from exc
    finally:
        reader.close()
        client.close()


def stop(worker: Any) -> None:
    """SIGTERM, then SIGKILL after STOP_S."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(STOP_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def _tail(log: Path, lines: int = 20) -> str:
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    return "\n".join(text[-lines:])


def _exited(what: str, process: Any, log: Path) -> WorkerRunError:
    return WorkerRunError(
        f"the {what} exited with status {process.returncode}; its log {log}:\n" + _tail(log)
    )


def _stalled(what: str, left: str, log: Path) -> WorkerRunError:
    return WorkerRunError(
        f"the {what} made no progress for {STALL_S:.0f} s with {left} left; its log {log}:\n"
        + _tail(log)
    )


def wait_caught_up(target: Settings, worker: Any, log: Path, progress: Progress) -> None:
    """Until the group has consumed every input and the outputs stay put for SETTLE_S."""
    kafka = target.kafka

    def partitions(specs: tuple[TopicSpec[Any], ...]) -> list[TopicPartition]:
        names = [spec.full_name(kafka.topic_prefix) for spec in specs]
        return [TopicPartition(name, p) for name in names for p in range(kafka.partitions)]

    copied, outputs = partitions(INPUTS), partitions(DERIVED)  # DERIVED holds pod.usage
    inputs = copied + partitions((POD_USAGE,))
    tps = copied + outputs
    reader = consumer(kafka, enable_auto_commit=False)
    client = admin(kafka)
    try:
        ends = reader.end_offsets(tps)
        progress.begin("rerun: inputs the worker consumed", sum(ends[tp] for tp in copied))
        last_state: Any = None
        moved = settled = time.monotonic()
        while True:
            if worker.poll() is not None:
                raise _exited("worker", worker, log)
            ends = reader.end_offsets(tps)
            done = _committed(client, kafka.app_id)
            lag = sum(max(0, ends[tp] - done.get(tp, 0)) for tp in inputs)
            progress.advance(sum(min(done.get(tp, 0), ends[tp]) for tp in copied) - progress.done)
            now = time.monotonic()
            # Not the tick or changelog topics: they move every tick, caught up or not.
            state = (tuple(ends[tp] for tp in tps), tuple(done.get(tp, 0) for tp in inputs))
            if state != last_state or lag:
                moved = now if state != last_state else moved
                settled, last_state = now, state
            elif now - settled >= SETTLE_S:
                return
            if now - moved > STALL_S:
                raise _stalled("worker", f"{lag} input records", log)
            time.sleep(0.5)
    except KafkaError as exc:
        raise WorkerRunError(f"watching the worker's progress failed: {exc!r}") from exc
    finally:
        progress.finish()
        reader.close()
        client.close()


def _committed(client: Any, group: str) -> dict[TopicPartition, int]:
    """The group's committed offsets; none before its first commit."""
    try:
        offsets = client.list_group_offsets({group: None}).get(group, {})
    except KafkaError:
        return {}
    return {tp: meta.offset for tp, meta in offsets.items() if meta.offset >= 0}


def forget_group(target: Settings) -> None:
    """Delete the rerun worker's consumer groups once it is gone (best effort)."""
    try:
        client = admin(target.kafka)
    except KafkaError:
        return
    try:
        known = {g["group_id"] for g in client.list_groups()}
        groups = [g for g in (target.kafka.app_id, redis_group(target)) if g in known]
        if groups:
            client.delete_groups(groups)
    except KafkaError:
        pass  # an empty group left behind is harmless; Kafka expires it
    finally:
        client.close()


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt in here, so the worker child is stopped on the way out.

    The child runs in a session of its own (Ctrl-C in the terminal reaches us only), so it
    would outlive a `gpuwatch replay` ended by SIGTERM without this.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
