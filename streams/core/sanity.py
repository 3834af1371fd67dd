"""Semantic checks of decoded messages that a JSON Schema cannot express, for the deadletter.

The codec already rejects wrong types and out-of-range values (negative bytes, percent above
100). What is left are relations between fields and plausibility: a check here fails only
where the message cannot be true (or is a unit mix-up), never on what a real driver or
kubelet reports, because a rejected node sample loses the tick of every GPU of the node. The
one exception is a clock: an event time further ahead of the worker's wall clock than the
clock skew allowed is refused although a badly set clock reports it, as accepting it would
move stream time there and make every other node's data late. The key check words why a
message's key is not its value's identity (`wrong_key`; the decoder compares the bytes).
Each function returns reasons, one line each; empty means OK. It runs per message on the hot
path, so a valid message costs a few comparisons per GPU and allocates nothing but the list.
"""

from __future__ import annotations

from collections import Counter

from schemas.k8s_node import K8sNode
from schemas.k8s_pod import K8sPod
from schemas.nvml_sample import NvmlSample

__all__ = [
    "CLOCK_SKEW_MS",
    "MAX_CLOCK_SKEW_MS",
    "MAX_INTERVAL_MS",
    "MAX_POWER_W",
    "MAX_TS_MS",
    "MAX_VALUE_BYTES",
    "MIN_INTERVAL_MS",
    "MIN_TS_MS",
    "check_node",
    "check_pod",
    "check_sample",
    "check_size",
    "unknown_devices",
    "wrong_key",
]

# A node sample of 8 GPUs, each split into 7 MIG instances with a few processes, is under
# 100 kB; pod and node events are a few kB. What is derived from one message (state in the
# changelog, records) is about its size, and Kafka takes 1 MB at most: a larger state or
# record would stop the worker. So a value larger than this is refused before decoding.
MAX_VALUE_BYTES = 512 * 1024
MIN_TS_MS = 1_420_070_400_000  # 2015-01-01Z: before Kubernetes 1.0; less is seconds, not ms
MAX_TS_MS = 4_102_444_800_000  # 2100-01-01Z: more is micro- or nanoseconds, not ms
MAX_CLOCK_SKEW_MS = 300_000  # the default of GPUWATCH_MAX_CLOCK_SKEW_S
MIN_INTERVAL_MS = 10  # NVML averages utilization over ~100 ms; under 10 ms is no sample
MAX_INTERVAL_MS = 3_600_000  # an hour: the agent claims its nominal interval after a stall
MAX_POWER_W = 5_000.0  # the largest GPU boards draw about 1.5 kW; more is milliwatts
CLOCK_SKEW_MS = 60_000  # kubelet vs API server clocks and 1 s timestamps: a minute's slack
_MEM_SLACK = 100  # used may exceed total by total/100: drivers round the total down
_SUM_RATIO, _SUM_SLACK = 1.5, 1 << 30  # processes vs device: separate reads, ms apart
_SHOWN = 100  # characters of a key or an identity a reason shows: hostile names run to 10 kB
_KEYS = {"node": "node name", "pod_uid": "pod uid"}


def check_size(raw: bytes) -> str | None:
    """Why a message value is too large to process, or None."""
    if len(raw) > MAX_VALUE_BYTES:
        return f"value of {len(raw)} bytes is over the limit of {MAX_VALUE_BYTES} bytes"
    return None


def wrong_key(key: bytes | None, identity: str, kind: str) -> str:
    """Why a message's key is wrong: it is not `identity`, the value's own `kind` of key
    (`TopicSpec.key`: "node", "pod_uid"), or there is none. The caller compares the bytes;
    this only words the reason."""
    what = f"the value's {_KEYS.get(kind, kind.replace('_', ' '))} {_shown(identity)}"
    if key is None:
        return f"no key: the key must be {what}"
    return f"key {_shown(key.decode('utf-8', 'backslashreplace'))} is not {what}"


def _shown(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def _seconds(ms: int) -> str:
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms / 1000:.3f} s"


def _time(field: str, ts: int, reference_ms: int | None, max_ahead_ms: int) -> str | None:
    """Why an event time is implausible, or None."""
    if ts < MIN_TS_MS:
        return f"{field} {ts} is before 2015 (seconds instead of milliseconds?)"
    if ts >= MAX_TS_MS:
        return f"{field} {ts} is after 2100 (micro- or nanoseconds instead of milliseconds?)"
    if reference_ms is not None and ts > reference_ms + max_ahead_ms:
        return (
            f"{field} {ts} is {_seconds(ts - reference_ms)} ahead of the wall clock "
            f"{reference_ms}, more than the clock skew allowed ({_seconds(max_ahead_ms)}, "
            "GPUWATCH_MAX_CLOCK_SKEW_S)"
        )
    return None


def check_sample(sample: NvmlSample, reference_ms: int | None, max_ahead_ms: int) -> list[str]:
    """Why a node sample cannot be true; `reference_ms` is the wall clock (None: no check),
    `max_ahead_ms` how far ahead of it an event time may be (`max_clock_skew_s`).

    The future is judged by the wall clock, not by stream time: after a gap (a node down
    for a week, live data after a replay of history) data far ahead of the stream time is
    normal, and rejecting it would stop the stream time there for good. Data ahead of the
    wall clock is another matter: it would move the partition's stream time there, close
    every other node's windows and find them silent, so one wrong clock (or a producer
    holding the Kafka credential) would make the partition's real data late.

    Not errors: a MIG instance whose parent is not in the sample (the parent's reading
    failed; the instance is still accountable), processes without memory readings (null is
    unknown), and allocations naming GPUs the sample lacks (see `unknown_devices`).
    """
    errors: list[str] = []
    if not sample.node:
        errors.append("node is empty")
    bad_ts = _time("ts", sample.ts, reference_ms, max_ahead_ms)
    if bad_ts is not None:
        errors.append(bad_ts)
    interval = sample.interval_ms
    if not MIN_INTERVAL_MS <= interval <= MAX_INTERVAL_MS:
        errors.append(f"interval_ms {interval} is outside {MIN_INTERVAL_MS}..{MAX_INTERVAL_MS}")
    gpus = sample.gpus
    if len(gpus) > 1 and len({gpu.uuid for gpu in gpus}) < len(gpus):
        twice = sorted(uuid for uuid, n in Counter(gpu.uuid for gpu in gpus).items() if n > 1)
        errors.append(f"gpu uuids listed more than once: {', '.join(twice)}")
    for gpu in gpus:
        total, used = gpu.mem_total_bytes, gpu.mem_used_bytes
        limit = total + total // _MEM_SLACK
        if used > limit:
            errors.append(f"gpu {gpu.uuid}: mem_used_bytes {used} > mem_total_bytes {total}")
        power = gpu.power_w
        if power is not None and power > MAX_POWER_W:
            errors.append(f"gpu {gpu.uuid}: power_w {power} is above {MAX_POWER_W:.0f} W")
        procs = gpu.processes
        if not procs:
            continue
        summed = 0
        for proc in procs:
            mem = proc.mem_bytes
            if mem is not None:
                summed += mem
                if mem > limit:
                    errors.append(
                        f"gpu {gpu.uuid}: pid {proc.pid} mem_bytes {mem} > mem_total_bytes"
                    )
        if summed > used * _SUM_RATIO + _SUM_SLACK:
            errors.append(f"gpu {gpu.uuid}: processes use {summed} bytes, mem_used_bytes is {used}")
        if len(procs) > 1 and len({proc.pid for proc in procs}) < len(procs):
            errors.append(f"gpu {gpu.uuid}: a pid is listed more than once")
    return errors


def unknown_devices(sample: NvmlSample) -> list[str]:
    """Warnings, not errors: allocated device ids that name no GPU of the sample.

    They are GPUs NVML no longer sees (fallen off the bus, or reset) that the kubelet still
    assigns; the sample is fine, the caller counts and logs them.
    """
    known = {gpu.uuid for gpu in sample.gpus}
    return [
        f"{item.namespace}/{item.pod} is allocated {device}, which NVML does not report"
        for item in sample.allocations
        for device in item.device_ids
        if device not in known
    ]


def check_pod(pod: K8sPod, reference_ms: int | None, max_ahead_ms: int) -> list[str]:
    """Why a pod event cannot be true; `reference_ms` is the wall clock (None: no check),
    `max_ahead_ms` how far ahead of it `ts` may be.

    Times set by the kubelet (started, finished) come from the node's clock and may precede
    `created_at` (the API server's clock, whole seconds) by up to `CLOCK_SKEW_MS`.
    """
    errors = [
        reason
        for reason in (
            _time("ts", pod.ts, reference_ms, max_ahead_ms),
            _time("created_at", pod.created_at, None, max_ahead_ms),
        )
        if reason is not None
    ]
    earliest = pod.created_at - CLOCK_SKEW_MS
    for field, value in (
        ("scheduled_at", pod.scheduled_at),
        ("started_at", pod.started_at),
        ("finished_at", pod.finished_at),
    ):
        if value is not None and value < earliest:
            errors.append(f"{field} {value} is before created_at {pod.created_at}")
    if pod.phase == "Running" and pod.node is None:
        errors.append("phase Running without a node")
    return errors


def check_node(node: K8sNode, reference_ms: int | None, max_ahead_ms: int) -> list[str]:
    """Why a node event cannot be true; `reference_ms` is the wall clock (None: no check),
    `max_ahead_ms` how far ahead of it `ts` may be.

    Its `ts` moves the partition's stream time like a sample's does, so a node event a year
    ahead would close every window of the partition at once: it is judged like a sample's.
    """
    errors = [] if node.node else ["node is empty"]
    bad_ts = _time("ts", node.ts, reference_ms, max_ahead_ms)
    if bad_ts is not None:
        errors.append(bad_ts)
    return errors
