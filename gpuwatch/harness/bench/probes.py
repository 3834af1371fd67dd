"""What `gpuwatch bench worker` reads: group offsets, Redis, the baselines.

The progress of a worker (or the Redis sink) is the committed offsets of its consumer
group, read through the admin API, so measuring costs the process nothing. The
baselines read the same topic: a bare aiokafka consumer in this process, and the Faust
floor (`gpuwatch.harness.bench.floor`) in a process of its own.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Self

from gpuwatch.harness.bench.procs import worker_env
from gpuwatch.kafka import KafkaError, admin, consumer
from gpuwatch.kafka import TopicPartition as KafkaTopicPartition
from schemas.settings import Settings
from schemas.topics import NVML_SAMPLES
from sinks.redis import client as redis_client
from sinks.redis.keys import RedisKeys
from streams.faust.clients import TopicPartition, aiokafka_consumer

__all__ = [
    "Baseline",
    "BaselineError",
    "CommitWatcher",
    "DecodeRun",
    "LatencyProbe",
    "Offsets",
    "Poller",
    "attempt",
    "bare_consumer",
    "faust_floor",
    "floor_groups",
    "floor_process",
    "floor_settings",
    "remaining",
]

READ_DEADLINE_S = 600.0  # the baselines read the full backlog in seconds; a loaded box more
FLOOR_APP_SUFFIX = {False: "", True: "-inbox"}
"""Added to the app id of each Faust floor: each reads in a consumer group of its own
(`{app_id}{suffix}-floor`, `gpuwatch.harness.bench.floor_app`), from the start. In one group
the second floor began at the first one's commits, at the end of most partitions, and waited
there."""


class BaselineError(RuntimeError):
    """A baseline did not read the backlog: its figures are unknown, the run's stand."""


class Offsets:
    """End offsets of the bench's topics and the committed offsets of the worker's group."""

    def __init__(self, settings: Settings) -> None:
        self.partitions = settings.kafka.partitions
        self.group = settings.kafka.app_id
        self._admin = admin(settings.kafka, client_id="gpuwatch-bench")
        self._consumer = consumer(settings.kafka, enable_auto_commit=False)

    def exists(self, topic: str) -> bool:
        """Whether the topic exists (the worker creates its tick topic when it starts)."""
        return topic in set(self._admin.list_topics())

    def ends(self, topic: str) -> int:
        """Messages in a topic: the sum of its partitions' end offsets."""
        tps = [KafkaTopicPartition(topic, p) for p in range(self.partitions)]
        return sum(self._consumer.end_offsets(tps).values())

    def partition_ends(self, topic: str) -> dict[int, int]:
        """The end offset of each partition of a topic."""
        tps = [KafkaTopicPartition(topic, p) for p in range(self.partitions)]
        return {tp.partition: offset for tp, offset in self._consumer.end_offsets(tps).items()}

    def committed(self, topic: str, group: str | None = None) -> int:
        """Messages of a topic a group (the worker's by default) has committed."""
        group = group or self.group
        tps = [KafkaTopicPartition(topic, p) for p in range(self.partitions)]
        offsets = self._admin.list_group_offsets({group: tps})[group]
        return sum(o.offset for o in offsets.values() if o.offset > 0)

    def members(self, group: str | None = None) -> int:
        """Members of a group (the worker's by default) once it is stable, else 0."""
        group = group or self.group
        # kafka-python warns, every call, that it cannot decode Faust's member metadata.
        logging.getLogger("kafka.admin._groups").setLevel(logging.ERROR)
        try:
            described: dict[str, Any] = self._admin.describe_groups([group]).get(group) or {}
        except KafkaError as exc:
            if not getattr(exc, "retriable", False):
                raise
            return 0  # a broker just started has no group coordinator yet: not stable either
        if described.get("group_state") != "Stable":
            return 0
        return len(described.get("members") or ())

    def close(self) -> None:
        """Close both clients."""
        self._consumer.close()
        self._admin.close()


class Poller:
    """Calls `_poll` every `interval_s` in a daemon thread, from `with` until its end."""

    def __init__(self, name: str, interval_s: float) -> None:
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._close()

    def _poll(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll()
            self._stop.wait(self._interval_s)


class CommitWatcher(Poller):
    """Reads the worker's committed offsets of one topic every `interval_s`, in a thread."""

    def __init__(
        self, settings: Settings, topic: str, interval_s: float = 0.2, group: str | None = None
    ) -> None:
        super().__init__("commit-watcher", interval_s)
        self._offsets = Offsets(settings)
        self._topic = topic
        self._group = group
        self.points: list[tuple[float, int]] = []
        """(monotonic time read, messages committed)."""

    def __enter__(self) -> Self:
        self._poll()
        return super().__enter__()

    def latest(self) -> int:
        """The last count read (0 before any)."""
        return self.points[-1][1] if self.points else 0

    def _poll(self) -> None:
        committed = self._offsets.committed(self._topic, self._group)
        self.points.append((time.monotonic(), committed))

    def _close(self) -> None:
        self._offsets.close()


class LatencyProbe(Poller):
    """Reads `updated_at` of the watched GPUs' Redis hashes often, in a thread."""

    def __init__(self, url: str, uuids: Iterable[str], interval_s: float = 0.02) -> None:
        super().__init__("latency-probe", interval_s)
        self._client = redis_client.connect(url, timeout_s=5)
        self._keys = RedisKeys()
        self._uuids = sorted(set(uuids))
        self._last: dict[str, int] = {}
        self.seen: list[tuple[str, int, float]] = []
        """(uuid, updated_at, wall time the value was first read) of every new value."""

    def latest(self, uuid: str) -> int | None:
        """The last `updated_at` read of a GPU."""
        return self._last.get(uuid)

    def _poll(self) -> None:
        pipe = self._client.pipeline(transaction=False)
        for uuid in self._uuids:
            pipe.hget(self._keys.gpu(uuid), "updated_at")
        values = pipe.execute()
        now = time.time()
        for uuid, value in zip(self._uuids, values, strict=True):
            if value is not None and int(value) != self._last.get(uuid):
                self._last[uuid] = int(value)
                self.seen.append((uuid, int(value), now))

    def _close(self) -> None:
        self._client.close()


@dataclass(frozen=True)
class DecodeRun:
    """A baseline's reading of the backlog."""

    seconds: float
    cpu_seconds: float
    gpu_samples: int

    @property
    def gpu_samples_per_s(self) -> float:
        """GPU-samples per second."""
        return self.gpu_samples / self.seconds

    @property
    def cpu_us_per_gpu_sample(self) -> float:
        """CPU microseconds per GPU-sample."""
        return self.cpu_seconds / self.gpu_samples * 1e6


@dataclass(frozen=True)
class Baseline:
    """A baseline's reading, or why there is none."""

    run: DecodeRun | None
    error: str | None = None


def attempt(read: Callable[[], DecodeRun]) -> Baseline:
    """The baseline `read` returns, or its failure as an error (the run goes on)."""
    try:
        return Baseline(read())
    except BaselineError as exc:
        return Baseline(None, str(exc))


def remaining(ends: Mapping[int, int]) -> dict[int, int]:
    """The last offset of each partition a reader must reach (partitions with data only)."""
    return {p: end - 1 for p, end in ends.items() if end > 0}


async def bare_consumer(settings: Settings, topic: str, ends: Mapping[int, int]) -> DecodeRun:
    """A bare aiokafka consumer decoding `topic` from the start until every partition's end.

    `ends` are the partitions' end offsets when the backlog was complete. Records after
    them (the paced load) are decoded as they come in the same fetches; the rate counts
    every record decoded.
    """
    consumer = aiokafka_consumer(
        settings.kafka,
        client_id="gpuwatch-bench-baseline",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.kafka.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        left = remaining(ends)
        gpus = 0
        deadline = time.monotonic() + READ_DEADLINE_S
        started, cpu = time.monotonic(), time.process_time()
        while left:
            if time.monotonic() > deadline:
                raise BaselineError(
                    f"the bare consumer did not reach the end of partitions {sorted(left)} "
                    f"within {READ_DEADLINE_S:.0f} s"
                )
            batches = await consumer.getmany(timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    gpus += len(NVML_SAMPLES.decode(record.value or b"").gpus)
                if records and records[-1].offset >= left.get(tp.partition, math.inf):
                    del left[tp.partition]
        return DecodeRun(time.monotonic() - started, time.process_time() - cpu, gpus)
    finally:
        await consumer.stop()


def floor_settings(settings: Settings, *, inbox: bool) -> Settings:
    """The settings a Faust floor runs with: an app id, so a consumer group, of its own."""
    kafka = settings.kafka
    app_id = f"{kafka.app_id}{FLOOR_APP_SUFFIX[inbox]}"
    return settings.model_copy(update={"kafka": kafka.model_copy(update={"app_id": app_id})})


def floor_groups(settings: Settings) -> list[str]:
    """The consumer groups of the two Faust floors (`gpuwatch.harness.bench.floor_app` adds
    `-floor`)."""
    return [f"{floor_settings(settings, inbox=i).kafka.app_id}-floor" for i in (False, True)]


def faust_floor(
    settings: Settings,
    redis_url: str,
    topic: str,
    ends: Mapping[int, int],
    *,
    inbox: bool = False,
    deadline_s: float = READ_DEADLINE_S,
) -> DecodeRun:
    """A Faust floor (`gpuwatch.harness.bench.floor`) on `topic` until every partition's end; with
    `inbox`, the records delivered as the worker's agents get them. BaselineError when it
    fails or has not read them all within `deadline_s`."""
    argv = [
        sys.executable,
        "-m",
        "gpuwatch.harness.bench.floor",
        topic,
        json.dumps(remaining(ends)),
    ]
    argv += ["inbox"] if inbox else []
    name = "inbox floor" if inbox else "Faust floor"
    env = worker_env(floor_settings(settings, inbox=inbox), redis_url)
    return floor_process(name, argv, env, deadline_s)


def floor_process(name: str, argv: list[str], env: dict[str, str], deadline_s: float) -> DecodeRun:
    """Run a floor's process to its end; its figures (its last JSON line).

    BaselineError when it exits with an error or without figures, or runs past
    `deadline_s` (then it is killed)."""
    try:
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=deadline_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        raise BaselineError(
            f"the {name} had not read the backlog within {deadline_s:g} s (killed)"
            + (f": {stderr[-500:]}" if stderr else "")
        ) from exc
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise BaselineError(f"the {name} failed ({done.returncode}): {done.stderr[-1000:]}")
    figures = json.loads(lines[-1])
    return DecodeRun(figures["seconds"], figures["cpu_seconds"], figures["gpu_samples"])
