"""`gpuwatch replay --rerun`: the stream logic over a past range again, into another prefix.

The inputs of the range (nvml.samples, k8s.pods, k8s.nodes) are copied into the topics of
the new prefix, then a `gpuwatch worker` child process (its own app id, the settings of
this environment, so `GPUWATCH_IDLE_UTIL_PCT=20` changes the threshold) turns them into
that prefix's derived topics and a Redis database of its own, until it has caught up:
every input consumed by its consumer group and the derived topics no longer growing.
Live topics are only read; the live prefix and the live Redis database are refused.

The range is widened to whole windows and its inputs copied; the worker is told where the
input ends (`GPUWATCH_WORKER_INPUT_END_MS`), so once it has caught up its stream time goes to
the end plus the lateness and every window of the range closes, however long the samples of
the last minutes were. Each pod's (and node's) last event before the range is copied first:
the worker then knows who runs where, as the live worker did.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import msgspec

from gpuwatch import kafka
from gpuwatch.kafka import KafkaError
from gpuwatch.replay.match import replaces
from gpuwatch.replay.read import Hit, Progress, RangeReader, ReadError
from gpuwatch.replay.rerun_processes import (
    DERIVED,
    INPUTS,
    WorkerRunError,
    forget_group,
    log_path,
    sigterm_interrupts,
    spawn,
    spawn_sink,
    stop,
    wait_caught_up,
    wait_sink_caught_up,
)
from gpuwatch.timerange import TimeRange
from schemas import (
    ATTRIBUTION,
    GPU_WINDOWS,
    NVML_SAMPLES,
    Attribution,
    GpuWindow,
    K8sNode,
    K8sPod,
    SchemaError,
    TopicSpec,
)
from schemas.fields import DEFAULT_CLUSTER
from schemas.settings import Settings
from sinks.redis.sink import redact_url

__all__ = [
    "RerunError",
    "RerunOptions",
    "RerunResult",
    "check_prefix",
    "in_cluster",
    "keep",
    "rerun",
    "rerun_redis_url",
    "widened",
]

MAX_REDIS_DB = 15  # Redis has 16 databases unless configured otherwise
_PREFIX = re.compile(r"[A-Za-z0-9._-]+")  # the settings' topic_prefix pattern, not empty


class RerunError(Exception):
    """The rerun cannot start or did not finish; the message says why."""


@dataclass(frozen=True)
class RerunOptions:
    """What `gpuwatch replay --rerun` was asked for."""

    to_prefix: str
    span: TimeRange
    margin_ms: int
    redis_url: str | None = None
    config: Path | None = None
    log_dir: Path | None = None
    cluster: str | None = None
    """Only this cluster's inputs are copied and re-processed (None: every cluster's)."""


@dataclass
class RerunResult:
    """What the rerun did and found."""

    prefix: str
    app_id: str
    redis_url: str
    span: TimeRange
    settings: dict[str, Any]
    cluster: str | None = None
    copied: dict[str, int] = field(default_factory=dict)
    before_range: dict[str, int] = field(default_factory=dict)
    derived: dict[str, int] = field(default_factory=dict)
    rerun_totals: dict[str, float] = field(default_factory=dict)
    live_totals: dict[str, float] = field(default_factory=dict)
    caught_up_s: float = 0.0
    worker_log: str = ""
    notes: list[str] = field(default_factory=list)


def check_prefix(live: str, target: str) -> None:
    """Refuse a target prefix whose topics could be the live ones, or no topic could have."""
    if not _PREFIX.fullmatch(target):
        raise RerunError(
            f"--to-prefix {target!r}: letters, digits, '.', '_' and '-' only, such as "
            "'replay-idle20.'"
        )
    if target == live or live.startswith(target):
        raise RerunError(
            f"--to-prefix {target!r} would write the live topics (prefix {live!r}); "
            "choose a name of its own such as 'replay-idle20.'"
        )


def _db(parts: Any) -> int:
    if parts.scheme == "unix":
        return int(parse_qs(parts.query).get("db", ["0"])[0])
    path = parts.path.strip("/")
    return int(path) if path else 0


def _where(url: str) -> tuple[str, str, int | None, int]:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return ("unix", parts.path, None, _db(parts))
    return (parts.scheme, parts.hostname or "", parts.port or 6379, _db(parts))


def rerun_redis_url(live: str, given: str | None) -> tuple[str, str | None]:
    """The Redis URL of the rerun and a note when it was chosen here; refuses the live one."""
    try:
        if given is not None:
            if _where(given) == _where(live):
                raise RerunError(
                    f"--redis-url {redact_url(given)} is the live Redis database; a rerun "
                    "writes another (default: the live one's database + 1)"
                )
            return given, None
        parts = urlsplit(live)
        db = _db(parts) + 1
    except ValueError as exc:
        raise RerunError(f"cannot read the Redis URL: {exc}") from exc
    if db > MAX_REDIS_DB:
        raise RerunError(f"the live Redis database is {db - 1}: give the rerun's with --redis-url")
    if parts.scheme == "unix":
        query = {**{k: v[0] for k, v in parse_qs(parts.query).items()}, "db": str(db)}
        url = f"unix://{parts.path}?{urlencode(query)}"  # urlunsplit drops the empty host
    else:
        url = urlunsplit(parts._replace(path=f"/{db}"))
    note = f"the rerun writes Redis database {db}, the live one's + 1 (--redis-url to choose)"
    return url, note


def widened(span: TimeRange, window_ms: int) -> TimeRange:
    """The range grown to whole windows: every window it touches is re-made whole."""
    start = span.start_ms // window_ms * window_ms
    end = -(-span.end_ms // window_ms) * window_ms
    return TimeRange(start, end)


def _rerun_settings(settings: Settings, prefix: str, partitions: int) -> Settings:
    app_id = f"gwreplay-{uuid.uuid4().hex[:10]}"
    kafka = settings.kafka.model_copy(
        update={"topic_prefix": prefix, "partitions": partitions, "app_id": app_id}
    )
    return settings.model_copy(update={"kafka": kafka})


def rerun(
    settings: Settings,
    options: RerunOptions,
    progress: Progress,
    say: Callable[[str], None] = lambda line: None,
) -> RerunResult:
    """Copy, re-process and summarise; RerunError when any step cannot be done."""
    live = settings.kafka.topic_prefix
    check_prefix(live, options.to_prefix)
    redis_url, note = rerun_redis_url(settings.redis.url.get_secret_value(), options.redis_url)
    if note:
        say(note)
    windows = settings.windows
    span = widened(options.span, windows.window_s * 1000)
    copy_span = span
    try:
        with RangeReader(settings.kafka, progress) as reader:
            source = reader.partitions(NVML_SAMPLES.full_name(live))
            if not source:
                raise RerunError(f"no topic {NVML_SAMPLES.full_name(live)} to re-process")
            target = _rerun_settings(settings, options.to_prefix, len(source))
            _create_empty_topics(target, reader)
            result = RerunResult(
                prefix=options.to_prefix,
                app_id=target.kafka.app_id,
                redis_url=redact_url(redis_url),
                span=span,
                settings=settings.rules.model_dump() | settings.windows.model_dump(),
                cluster=options.cluster,
            )
            _copy(
                reader,
                live=settings,
                target=target,
                span=span,
                copy_span=copy_span,
                margin_ms=options.margin_ms,
                result=result,
                cluster=options.cluster,
            )
            started = time.monotonic()
            log = log_path(options.log_dir, target)
            result.worker_log = str(log)
            sink_log = log_path(options.log_dir, target, "sink")
            with sigterm_interrupts():
                worker = spawn(target, redis_url, options.config, log, span.end_ms)
                sink = spawn_sink(target, redis_url, options.config, sink_log)
                try:
                    wait_caught_up(target, worker, log, progress)
                    wait_sink_caught_up(target, sink, sink_log)
                finally:
                    stop(worker)
                    stop(sink)
                    forget_group(target)
            result.caught_up_s = time.monotonic() - started
            _summarise(
                reader,
                live=settings,
                target=target,
                span=span,
                margin_ms=options.margin_ms,
                result=result,
            )
    except (ReadError, WorkerRunError) as exc:
        raise RerunError(str(exc)) from exc
    except KafkaError as exc:
        raise RerunError(f"Kafka refused a request: {exc!r}") from exc
    return result


def _create_empty_topics(target: Settings, reader: RangeReader) -> None:
    """Create the target's topics; refuse ones that already hold records (a previous rerun)."""
    names = [spec.full_name(target.kafka.topic_prefix) for spec in (*INPUTS, *DERIVED)]
    plan = reader.plan(names, TimeRange(0, 0), from_beginning=True)
    used = sorted({p.topic for p in plan.parts if p.end > 0})
    if used:
        raise RerunError(
            f"topics under {target.kafka.topic_prefix!r} already hold records "
            f"({', '.join(used)}): choose a new --to-prefix"
        )
    try:
        rows = kafka.create_topics(target)
    except kafka.TopicAdminError as exc:
        raise RerunError(str(exc)) from exc
    if not all(row.ok for row in rows):
        raise RerunError("topics not created:\n" + kafka.format_report(rows))


def _copy(
    reader: RangeReader,
    *,
    live: Settings,
    target: Settings,
    span: TimeRange,
    copy_span: TimeRange,
    margin_ms: int,
    result: RerunResult,
    cluster: str | None = None,
) -> None:
    """Each input's records of the range, same key and partition, the states before first;
    of `cluster` alone when given. The live windows the rerun is compared with are those of
    the pods and GPUs it made windows for, so of that cluster too."""
    prefix = live.kafka.topic_prefix
    producer = kafka.producer(live.kafka, acks="all", linger_ms=20)
    try:
        for spec in INPUTS:
            name = spec.full_name(prefix)
            stateful = spec is not NVML_SAMPLES
            plan = reader.plan([name], copy_span, from_beginning=stateful)
            # Node names (the key of k8s.nodes) repeat across clusters: a state is the last
            # of its key in its cluster.
            last: dict[tuple[str | None, bytes | None], Hit] = {}
            kept: list[Hit] = []
            for hit in reader.read(plan, [name], copy_span, margin_ms):
                of = cluster_of(hit.value) if cluster is not None or stateful else None
                if cluster is not None and of != cluster:
                    continue
                if copy_span.holds(hit.ts):
                    if stateful:
                        kept.append(hit)  # after the states before the range, below
                    else:
                        _send(producer, spec, target, hit, result)
                elif stateful and hit.ts < span.start_ms and hit.ts >= _ts(last.get((of, hit.key))):
                    last[(of, hit.key)] = hit
            before = sorted((h for h in last.values() if in_cluster(spec, h)), key=lambda h: h.ts)
            for hit in [*before, *kept]:
                _send(producer, spec, target, hit, result)
            result.before_range[spec.name] = len(before)
            if spec is NVML_SAMPLES and not result.copied.get(spec.name):
                # First, so that the target's topics stay empty and the prefix reusable.
                raise RerunError(f"no node samples in the range in {name}: nothing to re-process")
        producer.flush(timeout=60)
    except KafkaError as exc:
        raise RerunError(f"copying the inputs failed: {exc!r}") from exc
    finally:
        producer.close()


class _ClusterOf(msgspec.Struct):
    cluster: str = DEFAULT_CLUSTER


_CLUSTER_OF = msgspec.json.Decoder(_ClusterOf)


def cluster_of(raw: bytes) -> str | None:
    """The cluster an input message names (the default one when it names none); None when
    it is not a JSON object with a string `cluster` (the worker dead-letters it)."""
    try:
        return _CLUSTER_OF.decode(raw).cluster
    except msgspec.DecodeError:
        return None


def _ts(hit: Hit | None) -> int:
    return -1 if hit is None else hit.ts


def in_cluster(spec: TopicSpec[Any], hit: Hit) -> bool:
    """A pod or node whose last event before the range leaves it in the cluster."""
    try:
        value = spec.decode(hit.value)
    except SchemaError:
        return False
    if isinstance(value, K8sPod):
        return value.type != "DELETED" and value.phase not in ("Succeeded", "Failed")
    return isinstance(value, K8sNode) and value.type != "DELETED"


def _send(
    producer: Any, spec: TopicSpec[Any], target: Settings, hit: Hit, result: RerunResult
) -> None:
    """To the same partition (the worker's co-partitioning), or by key where there is none."""
    partition = hit.partition if hit.partition < target.kafka.partitions else None
    name = spec.full_name(target.kafka.topic_prefix)
    producer.send(name, key=hit.key, value=hit.value, partition=partition)
    result.copied[spec.name] = result.copied.get(spec.name, 0) + 1


K = TypeVar("K")
V = TypeVar("V")


def keep(kept: dict[K, V], key: K, value: V) -> None:
    """File a window's copy under its identity unless the copy kept is a newer revision."""
    before = kept.get(key)
    if before is None or replaces(value, before):
        kept[key] = value


def totals(attributions: list[Attribution], windows: list[GpuWindow]) -> dict[str, float]:
    """The sums the summary compares: pod windows and GPU windows."""
    return {
        "pod_windows": len(attributions),
        "allocated_gpu_seconds": sum(a.allocated_gpu_seconds for a in attributions),
        "used_gpu_seconds": sum(a.used_gpu_seconds for a in attributions),
        "idle_gpu_seconds": sum(a.idle_gpu_seconds for a in attributions),
        "cost_usd": sum(a.cost_usd for a in attributions),
        "waste_usd": sum(a.waste_usd for a in attributions),
        "gpu_windows": len(windows),
        "gpu_idle_seconds": sum(w.idle_seconds for w in windows),
        "gpu_allocated_idle_seconds": sum(w.allocated_idle_seconds for w in windows),
    }


def _windows(
    reader: RangeReader, prefix: str, span: TimeRange, margin_ms: int, *, everything: bool
) -> tuple[list[Attribution], list[GpuWindow]]:
    """Attribution and GPU windows that lie inside the range, once per identity, each at the
    newest revision read."""
    names = [ATTRIBUTION.full_name(prefix), GPU_WINDOWS.full_name(prefix)]
    plan = reader.plan(names, span, from_beginning=everything)
    pods: dict[tuple[str, str, int], Attribution] = {}
    gpus: dict[tuple[str, str, int], GpuWindow] = {}
    for hit in reader.read(plan, names, span, margin_ms):
        spec = ATTRIBUTION if hit.topic == names[0] else GPU_WINDOWS
        try:
            value = spec.decode(hit.value)
        except SchemaError:
            continue
        if value.window_start < span.start_ms or value.window_end > span.end_ms:
            continue
        if isinstance(value, Attribution):
            keep(pods, (value.cluster, value.uid, value.window_start), value)
        else:
            keep(gpus, (value.cluster, value.uuid, value.window_start), value)
    return list(pods.values()), list(gpus.values())


def _summarise(
    reader: RangeReader,
    *,
    live: Settings,
    target: Settings,
    span: TimeRange,
    margin_ms: int,
    result: RerunResult,
) -> None:
    """Records per derived topic; idle and waste of the rerun and of live over its windows."""
    prefix = target.kafka.topic_prefix
    names = [spec.full_name(prefix) for spec in DERIVED]
    plan = reader.plan(names, span, from_beginning=True)
    for spec, name in zip(DERIVED, names, strict=True):
        result.derived[spec.name] = sum(p.end - p.begin for p in plan.parts if p.topic == name)
    pods, gpus = _windows(reader, prefix, span, margin_ms, everything=True)
    result.rerun_totals = totals(pods, gpus)
    live_pods, live_gpus = _windows(
        reader, live.kafka.topic_prefix, span, margin_ms, everything=False
    )
    same_pods = {(a.uid, a.window_start) for a in pods}
    same_gpus = {(w.uuid, w.window_start) for w in gpus}
    result.live_totals = totals(
        [a for a in live_pods if (a.uid, a.window_start) in same_pods],
        [w for w in live_gpus if (w.uuid, w.window_start) in same_gpus],
    )
    if result.live_totals["pod_windows"] < len(pods):
        result.notes.append(
            f"live holds {result.live_totals['pod_windows']:.0f} of the rerun's "
            f"{len(pods)} pod windows: the live sums cover those only"
        )
