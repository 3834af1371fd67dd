"""`gpuwatch replay`: what happened to a pod, a GPU or a node over a time range, from Kafka.

Two passes over the topics (`gpuwatch.replay.read` finds the offsets by time). First the
derived topics and the pod or node events, filtered by the subject's name before decoding;
they say which uids, nodes and GPUs the subject had. Then the node samples, of those
nodes only, folded into per-GPU summaries. A pod that only the samples' kubelet
allocations name (no worker ran) is found in the second pass, by scanning every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatch.kafka import KafkaError
from gpuwatch.replay.match import assemble, resolve, state_bands
from gpuwatch.replay.read import Hit, Plan, Progress, RangeReader, ReadError
from gpuwatch.replay.story import Collected, SampleDigest, Scope, Story, Subject
from gpuwatch.timerange import TimeRange, format_duration, format_time
from schemas import (
    ALERTS,
    ATTRIBUTION,
    GPU_WINDOWS,
    K8S_NODES,
    K8S_PODS,
    K8S_WORKLOADS,
    NVML_SAMPLES,
    POD_LIFECYCLE,
    SchemaError,
    TopicSpec,
)
from schemas.settings import Settings

__all__ = ["MIN_MARGIN_S", "ReplayError", "default_margin_s", "timeline"]

MIN_MARGIN_S = 300  # five minutes: a window ending at --to is written lateness + a tick later,
# and a worker restarted within the five minutes still writes it inside the margin


class ReplayError(Exception):
    """The story cannot be told: unknown pod, empty range, range past retention, Kafka away."""


def default_margin_s(settings: Settings) -> int:
    """How long after `--to` records of the range may have been written."""
    windows = settings.windows
    return max(MIN_MARGIN_S, 2 * windows.window_s + windows.allowed_lateness_s)


_FIRST_PASS: dict[str, tuple[TopicSpec[Any], ...]] = {
    "pod": (POD_LIFECYCLE, ATTRIBUTION, ALERTS, GPU_WINDOWS, K8S_PODS, K8S_WORKLOADS),
    "gpu": (POD_LIFECYCLE, ATTRIBUTION, ALERTS, GPU_WINDOWS),
    "node": (POD_LIFECYCLE, ATTRIBUTION, ALERTS, GPU_WINDOWS, K8S_NODES),
}
# Records that can concern a GPU without naming it: its holders' transitions and alerts.
_KEEP_ALL_FOR_GPU = frozenset({POD_LIFECYCLE.name, ALERTS.name})
_WORKLOAD_ALERT = b'"kind":"workload"'  # a Kueue workload's alert (its subject), compact JSON


@dataclass
class _Decoded:
    bad: int = 0


def _decode(spec: TopicSpec[Any], hit: Hit, decoded: _Decoded) -> Any:
    try:
        return spec.decode(hit.value)
    except SchemaError:
        decoded.bad += 1  # the worker's deadletter holds it; a story goes on without it
        return None


def timeline(
    settings: Settings,
    subject: Subject,
    span: TimeRange,
    *,
    margin_ms: int,
    progress: Progress | None = None,
    keep_series: bool = False,
) -> Story:
    """Read the range and tell the subject's story; ReplayError when there is none."""
    prefix = settings.kafka.topic_prefix
    first = _FIRST_PASS[subject.kind]
    by_name = {spec.full_name(prefix): spec for spec in (*first, NVML_SAMPLES)}
    needle, decoded = subject.needle, _Decoded()
    namespace_needle = f'"namespace":"{subject.pod[0]}"'.encode() if subject.kind == "pod" else b""
    try:
        with RangeReader(settings.kafka, progress) as reader:
            plan = reader.plan(list(by_name), span)
            if len(plan.missing) == len(by_name):
                raise ReplayError(
                    f"no gpuwatch topics with the prefix {prefix!r} at {settings.kafka.bootstrap}"
                    " (--topic-prefix, GPUWATCH_TOPIC_PREFIX)"
                )
            found, clusters = Collected(), set()
            names = [spec.full_name(prefix) for spec in first]
            for hit in reader.read(plan, names, span, margin_ms):
                spec = by_name[hit.topic]
                keep_all = subject.kind == "gpu" and spec.name in _KEEP_ALL_FOR_GPU
                if spec.name == K8S_WORKLOADS.name or (
                    spec.name == ALERTS.name and _WORKLOAD_ALERT in hit.value
                ):  # they name no pod: those of its namespace (matched by its job's uid)
                    keep_all = namespace_needle in hit.value
                if (keep_all or needle in hit.value) and (
                    value := _decode(spec, hit, decoded)
                ) is not None:
                    clusters.add(value.cluster)
                    if subject.of(value):
                        found.add(value)
            scope = resolve(subject, found)
            digest = SampleDigest(subject, span, scope, keep_series=keep_series)
            nodes = {node.encode() for node in scope.nodes}
            samples = NVML_SAMPLES.full_name(prefix)
            for hit in reader.read(plan, [samples], span, margin_ms):
                wanted = hit.key in nodes if nodes else needle in hit.value
                if wanted and span.holds(hit.ts):
                    sample = _decode(NVML_SAMPLES, hit, decoded)
                    if sample is not None and subject.of(sample):
                        digest.add(sample)
    except ReadError as exc:
        raise ReplayError(str(exc)) from exc
    except KafkaError as exc:
        raise ReplayError(f"Kafka refused a request: {exc!r}") from exc
    _check_found(subject, span, plan, scope, prefix)
    summaries = digest.summaries()
    events = assemble(subject, span, found, scope, summaries)
    story = Story(
        subject=subject,
        range=span,
        scope=scope,
        events=events,
        samples=summaries,
        series=digest.series,
        bands=state_bands(events, span) if subject.kind == "pod" else [],
    )
    story.notes.extend(_notes(plan, span, margin_ms, decoded.bad, prefix))
    if subject.cluster is None and len(clusters) > 1:
        story.notes.append(
            f"records of {len(clusters)} clusters name this {subject.kind} "
            f"({', '.join(sorted(clusters))}): --cluster NAME keeps one"
        )
    return story


def _check_found(subject: Subject, span: TimeRange, plan: Plan, scope: Scope, prefix: str) -> None:
    between = f"between {format_time(span.start_ms)} and {format_time(span.end_ms)} UTC"
    read = sum(plan.scanned.values())
    topics = ", ".join(sorted({p.topic for p in plan.parts}))
    if not sum(plan.in_range.values()):
        gone = plan.retained_from()
        if gone and max(gone.values()) > span.start_ms:
            earliest = min(gone.values())
            per_topic = "; ".join(f"{t} from {format_time(ms)}" for t, ms in sorted(gone.items()))
            raise ReplayError(
                f"the range {between} is older than the topics' retention: the earliest time "
                f"available is {format_time(earliest)} UTC ({per_topic})"
            )
        if plan.emptied():
            raise ReplayError(
                f"nothing recorded {between}, and retention deleted every record of "
                f"{', '.join(plan.emptied())} (older ranges are gone)"
            )
        raise ReplayError(
            f"empty range: nothing recorded {between} under the prefix {prefix!r} "
            f"({read} records read of {topics}); times are UTC, relative ones (-2h) "
            "count back from now"
        )
    if subject.kind == "pod" and not scope.uids:
        raise ReplayError(
            f"unknown pod {subject.value}: no pod of that namespace and name {between} in "
            f"{read} records of {topics} (pod events, lifecycle, attribution, alerts, GPU "
            "windows and the node samples' allocations); check the name with `gpuwatch top`"
        )


def _notes(plan: Plan, span: TimeRange, margin_ms: int, bad: int, prefix: str) -> list[str]:
    notes = [
        f"records written up to {format_duration(margin_ms)} after --to were read "
        "(--margin); later ones are left out"
    ]
    gone = {t: ms for t, ms in plan.retained_from().items() if ms > span.start_ms}
    if gone:
        notes.extend(
            f"{topic}: records before {format_time(ms)} UTC are gone (retention)"
            for topic, ms in sorted(gone.items())
        )
    if plan.missing:
        notes.append(f"topics missing under {prefix!r}: {', '.join(plan.missing)}")
    if bad:
        notes.append(f"{bad} records could not be decoded and were left out (see deadletter)")
    return notes
