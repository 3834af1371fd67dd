"""The period's records from Kafka into an `Aggregator`, through `gpuwatch replay`'s reader.

Two passes over one plan (offsets found by time, `gpuwatch.replay.read`): first
`attribution` and `k8s.nodes`, whose cost and node labels price the GPU time, then
`gpu.windows`. Each record is decoded once with its topic's msgspec codec; one that does
not decode (or has no `ts`) is counted and skipped, never fatal.

The settings say how long the worker revises a closed window (`revision_horizon_s`): the
records written that long after the margin past `--to` are read too (the period's last
windows may be revised then), and each partition's windows are remembered for about as
long (`gpuwatch.report.revisions`), so that a revision replaces the copy counted before.
"""

from __future__ import annotations

from typing import Any

from gpuwatch.kafka import KafkaError
from gpuwatch.replay.read import Plan, Progress, RangeReader, ReadError
from gpuwatch.report.aggregate import Aggregator
from gpuwatch.report.revisions import dedup_horizon_ms
from gpuwatch.timerange import format_duration, format_time
from schemas import ATTRIBUTION, GPU_WINDOWS, K8S_NODES, SchemaError, TopicSpec
from schemas.settings import Settings

__all__ = ["ReportError", "read_period"]


class ReportError(Exception):
    """The period cannot be read: no topics under the prefix, Kafka away."""


def read_period(
    settings: Settings,
    aggregator: Aggregator,
    *,
    margin_ms: int,
    progress: Progress | None = None,
) -> list[str]:
    """Add the period's records to `aggregator`; notes on what was read and left out.

    `margin_ms`: records written that long after `--to` are read, and the worker's revision
    horizon more (see the module doc)."""
    prefix = settings.kafka.topic_prefix
    specs: dict[str, TopicSpec[Any]] = {
        spec.full_name(prefix): spec for spec in (ATTRIBUTION, K8S_NODES, GPU_WINDOWS)
    }
    attribution, nodes, windows = specs
    span = aggregator.period
    progress = progress or Progress(verb="report")
    aggregator.widen_dedup_horizon(dedup_horizon_ms(settings.windows))
    margin_ms += settings.windows.revision_horizon_s * 1000
    added: dict[str, int] = dict.fromkeys(specs, 0)
    try:
        with RangeReader(settings.kafka, progress, client_id="gpuwatch-report") as reader:
            plan = reader.plan(list(specs), span)
            if len(plan.missing) == len(specs):
                raise ReportError(
                    f"no gpuwatch topics with the prefix {prefix!r} at {settings.kafka.bootstrap}"
                    " (--topic-prefix, GPUWATCH_TOPIC_PREFIX)"
                )
            for hit in reader.read(plan, [attribution, nodes], span, margin_ms):
                added[hit.topic] += 1
                value = _decode(specs[hit.topic], hit.value, aggregator)
                if value is None:
                    continue
                if hit.topic == attribution:
                    aggregator.add_attribution(value, (hit.topic, hit.partition))
                else:
                    aggregator.add_node(value)
            for hit in reader.read(plan, [windows], span, margin_ms):
                added[hit.topic] += 1
                value = _decode(GPU_WINDOWS, hit.value, aggregator)
                if value is not None:
                    aggregator.add_gpu_window(value, (hit.topic, hit.partition))
    except ReadError as exc:
        raise ReportError(str(exc)) from exc
    except KafkaError as exc:
        raise ReportError(f"Kafka refused a request: {exc!r}") from exc
    # Records without a `ts` the reader skipped: they did not decode either.
    aggregator.counts.undecodable += sum(plan.scanned.get(t, 0) - n for t, n in added.items())
    return _notes(plan, span.start_ms, margin_ms, prefix)


def _decode(spec: TopicSpec[Any], raw: bytes, aggregator: Aggregator) -> Any:
    try:
        return spec.decode(raw)
    except SchemaError:
        aggregator.counts.undecodable += 1  # the worker's deadletter has its story
        return None


def _notes(plan: Plan, start_ms: int, margin_ms: int, prefix: str) -> list[str]:
    notes = [
        f"records written up to {format_duration(margin_ms)} after --to were read (a "
        "window's record comes after it closes, its revisions up to the worker's revision "
        "horizon later); later ones are left out"
    ]
    notes.extend(
        f"{topic}: records before {format_time(ms)} UTC are gone (retention)"
        for topic, ms in sorted(plan.retained_from().items())
        if ms > start_ms
    )
    if plan.missing:
        notes.append(f"topics missing under {prefix!r}: {', '.join(plan.missing)}")
    return notes
