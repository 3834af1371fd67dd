"""GPU health rules where node samples land: Xid errors, uncorrectable ECC, failed row
remapping and clock slowdowns, each naming the pods that held the GPU at that moment.

Called by `gpu_alerts.on_sample` with the node's faults and the sample (and by
`on_watermark` as stream time passes); pure, like the rest of the core. Semantics and
the choices made: streams/SEMANTICS-alerts.md, "GPU health".

- `GpuXidError` fires on the sample that reports an Xid code on a GPU (or on a MIG
  instance, where the driver names one), one alert per (GPU, code); it resolves
  `xid_alert_hold_s` of stream time after the last sample that reported that code: an Xid
  is an event, and a GPU that fell off the bus (79) reports nothing after it.
- `GpuEccUncorrectable` fires when a GPU's volatile double-bit ECC count rises (or first
  reads above 0) and resolves when it reads 0 again (the count is reset with the GPU).
- `GpuRowRemapFailure` fires while the GPU says a row remapping failed.
- `GpuThrottled` fires once a slowdown (`SLOWDOWNS`) has been active `throttle_alert_after_s`
  on consecutive samples, and resolves on the first sample without one. `sw_power_cap` and
  `sync_boost` are the driver managing power as configured, not a fault: they raise nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec

from schemas.alert import Alert, AlertName, AlertSubject, Severity
from schemas.fields import DEFAULT_CLUSTER
from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.nvml_sample import GpuReading, NvmlSample
from streams.core.alert_identity import fingerprint, in_cluster, with_cluster
from streams.core.split import AllocationIndex

__all__ = [
    "HEALTH_SEVERITY",
    "SLOWDOWNS",
    "XID_MEANINGS",
    "Fault",
    "gpu_labels",
    "health_expired",
    "health_firing",
    "health_removed",
    "health_step",
    "xid_meaning",
]

HEALTH_SEVERITY: Final[dict[AlertName, Severity]] = {
    "GpuXidError": "critical",  # the code's own where `XID_MEANINGS` knows it
    "GpuEccUncorrectable": "critical",  # data on the GPU may be wrong; the job's results too
    "GpuRowRemapFailure": "critical",  # the GPU's memory cannot be repaired: replace it
    "GpuThrottled": "warning",  # slower, not broken: a training job silently takes longer
}

# The common Xid codes: what each means and how bad it is (NVIDIA's Xid catalogue). An
# application's own fault (13, 31, 43, 45) is a warning; one the GPU needs a reset or a
# replacement for, critical. A code not listed is critical and named by its number.
XID_MEANINGS: Final[dict[int, tuple[str, Severity]]] = {
    13: ("graphics engine exception", "warning"),
    31: ("GPU memory page fault", "warning"),
    43: ("GPU stopped processing", "warning"),
    45: ("preemptive cleanup after earlier errors", "warning"),
    48: ("double-bit ECC error", "critical"),
    63: ("ECC page retirement or row remapping recorded", "warning"),
    64: ("ECC page retirement or row remapping failed", "critical"),
    74: ("NVLink error", "critical"),
    79: ("GPU has fallen off the bus", "critical"),
    92: ("high single-bit ECC error rate", "warning"),
    94: ("contained ECC error", "warning"),
    95: ("uncontained ECC error", "critical"),
    119: ("GSP RPC timeout", "critical"),
    120: ("GSP error", "critical"),
}

SLOWDOWNS: Final = frozenset(
    {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}
)
"""Clock event reasons that raise GpuThrottled: the GPU slows itself for heat or power."""

_MS = 1000
Kind = Literal["xid", "ecc", "remap", "throttle"]
_NAMES: Final[dict[str, AlertName]] = {
    "xid": "GpuXidError",
    "ecc": "GpuEccUncorrectable",
    "remap": "GpuRowRemapFailure",
    "throttle": "GpuThrottled",
}


class Fault(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One health condition of one GPU since `since`, stored in the node's alert state.

    Keyed `kind/uuid` (`kind/uuid/code` for an Xid). `last`: the end of the newest sample
    that showed it. `labels` are the GPU's and its holders' as they were when it fired (or,
    for a slowdown not yet firing, at its start); `value` is what the firing message said.
    """

    since: int
    last: int
    firing: bool = False
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    value: float = 0.0


def xid_meaning(code: int) -> tuple[str, Severity]:
    """What an Xid code means and its severity; `Xid <code>`, critical, for one not listed."""
    return XID_MEANINGS.get(code, (f"Xid {code}", "critical"))


def _holders(sample: NvmlSample, gpu: GpuReading, index: AllocationIndex) -> list[PodUid]:
    """The pods that hold `gpu` now: of a MIG-enabled GPU, those of its instances too."""
    held = list(index.holders.get(gpu.uuid, ()))
    if gpu.parent_uuid is None:
        for other in sample.gpus:
            if other.parent_uuid == gpu.uuid:
                held += [uid for uid in index.holders.get(other.uuid, ()) if uid not in held]
    return held


def gpu_labels(sample: NvmlSample, gpu: GpuReading, who: list[str]) -> dict[str, str]:
    """Routing labels of a GPU alert: node, gpu, model (and MIG profile), the pods named
    as `ns/pod` (and the cluster, where it is a named one)."""
    labels = with_cluster(
        {"node": sample.node, "gpu": gpu.uuid, "model": gpu.model}, sample.cluster
    )
    if gpu.mig_profile is not None:
        labels["mig_profile"] = gpu.mig_profile
    if len(who) == 1:
        labels["namespace"], labels["pod"] = who[0].split("/", 1)
    elif who:
        labels["pods"] = ",".join(who)
    return labels


def _labels(
    sample: NvmlSample, gpu: GpuReading, holders: list[PodUid], index: AllocationIndex
) -> dict[str, str]:
    """`gpu_labels` with the holders named, and their uids (`pod_uid` or `pod_uids`)."""
    named = sorted((index.names[uid], uid) for uid in holders if uid in index.names)
    labels = gpu_labels(sample, gpu, ["/".join(name) for name, _ in named])
    if len(named) == 1:
        labels["pod_uid"] = named[0][1]
    elif named:
        labels["pod_uids"] = ",".join(uid for _, uid in named)
    return labels


class _Now:
    """The labels of one GPU as the sample shows it, worked out once when first needed."""

    def __init__(self, sample: NvmlSample, gpu: GpuReading, index: AllocationIndex) -> None:
        self._args = (sample, gpu, index)
        self._labels: dict[str, str] | None = None

    def labels(self) -> dict[str, str]:
        if self._labels is None:
            sample, gpu, index = self._args
            self._labels = _labels(sample, gpu, _holders(sample, gpu, index), index)
        return dict(self._labels)


def _who(labels: dict[str, str]) -> str:
    if "pod" in labels:
        return f"pod {labels['namespace']}/{labels['pod']}"
    if "pods" in labels:
        return "pods " + ", ".join(labels["pods"].split(","))
    return "no pod"


def _where(labels: dict[str, str]) -> str:
    return f"{labels['gpu']} ({labels['model']}) on {labels['node']}"


def _message(kind: str, key: str, fault: Fault, ts: int, *, firing: bool, why: str = "") -> Alert:
    """A firing or resolved message of `fault`."""
    labels = fault.labels
    name = _NAMES[kind]
    cluster = labels.get("cluster", DEFAULT_CLUSTER)
    severity = HEALTH_SEVERITY[name]
    where, who, secs = _where(labels), _who(labels), max(ts - fault.since, 0) // _MS
    value = fault.value
    if kind == "xid":
        code = int(labels["xid"])
        meaning, severity = xid_meaning(code)
        text = f"Xid {code} ({meaning}) on {where}; held by {who}"
        summary = text if firing else f"no Xid {code} on {where} for {why}"
    elif kind == "ecc":
        count = int(fault.value)
        text = f"{count} uncorrectable ECC error(s) on {where} since its last reset; held by {who}"
        summary = text if firing else f"uncorrectable ECC count of {where} reads 0 again"
    elif kind == "remap":
        text = f"row remapping failed on {where}: its memory cannot be repaired; held by {who}"
        summary = text if firing else f"row remapping of {where} no longer reports a failure"
    else:
        reasons = labels["reasons"].replace(",", ", ")
        summary = (
            f"{where} throttled ({reasons}) for {secs} s; held by {who}"
            if firing
            else f"{where} no longer throttled ({why}) after {secs} s"
        )
        value = float(secs)
    return Alert(
        schema="gpuwatch.alert/v1",
        fingerprint=fingerprint(name, "gpu", key.split("/", 1)[1], cluster),
        name=name,
        status="firing" if firing else "resolved",
        severity=severity,
        ts=ts,
        since=fault.since,
        subject=AlertSubject(
            kind="gpu", uid=None, uuid=GpuUuid(labels["gpu"]), node=NodeName(labels["node"])
        ),
        labels=labels,
        summary=in_cluster(summary, cluster),
        value=value,
        cluster=cluster,
    )


class _Step:
    """One sample applied to a node's faults: copies made on the first change only."""

    def __init__(
        self,
        faults: dict[str, Fault],
        dbe: dict[GpuUuid, int],
        sample: NvmlSample,
        index: AllocationIndex,
        throttle_ms: int,
    ) -> None:
        self.faults, self.dbe = faults, dbe
        self.sample, self.index, self.throttle_ms = sample, index, throttle_ms
        self.ts, self.end = sample.ts, sample.ts + sample.interval_ms
        self.out: list[Alert] = []
        self._copied = self._dbe_copied = False

    def put(self, key: str, fault: Fault | None) -> None:
        if not self._copied:
            self.faults, self._copied = dict(self.faults), True
        if fault is None:
            self.faults.pop(key, None)
        else:
            self.faults[key] = fault

    def fire(self, kind: str, key: str, fault: Fault, ts: int) -> None:
        self.put(key, fault)
        self.out.append(_message(kind, key, fault, ts, firing=True))

    def end_fault(self, kind: str, key: str, fault: Fault, why: str = "") -> None:
        self.put(key, None)
        if fault.firing:
            self.out.append(_message(kind, key, fault, self.ts, firing=False, why=why))

    def gpu(self, gpu: GpuReading) -> None:
        uuid, faults = gpu.uuid, self.faults
        rows, reasons = gpu.remapped_rows, gpu.throttle_reasons
        known = self.dbe.get(uuid, 0)
        failed = rows is not None and rows.failed
        if not (gpu.xid_errors or gpu.ecc_dbe or known or failed or reasons) and not (
            faults and (f"remap/{uuid}" in faults or f"throttle/{uuid}" in faults)
        ):
            return  # the common case: nothing to report and nothing open to end
        now = _Now(self.sample, gpu, self.index)
        for code in sorted(set(gpu.xid_errors)):
            key = f"xid/{uuid}/{code}"
            fault = self.faults.get(key)
            if fault is not None:
                self.put(key, msgspec.structs.replace(fault, last=self.end))
            else:
                labels = now.labels() | {"xid": str(code)}
                fault = Fault(since=self.ts, last=self.end, firing=True, labels=labels)
                self.fire("xid", key, msgspec.structs.replace(fault, value=float(code)), self.ts)
        if gpu.ecc_dbe is not None and gpu.ecc_dbe != known:
            self._ecc(uuid, gpu.ecc_dbe, known, now)
        if rows is not None:
            key = f"remap/{uuid}"
            fault = self.faults.get(key)
            if rows.failed and fault is None:
                labels = now.labels()
                fault = Fault(since=self.ts, last=self.end, firing=True, labels=labels, value=1.0)
                self.fire("remap", key, fault, self.ts)
            elif not rows.failed and fault is not None:
                self.end_fault("remap", key, fault)
        if reasons is not None:
            self._throttle(uuid, reasons, now)

    def _ecc(self, uuid: GpuUuid, count: int, known: int, now: _Now) -> None:
        if not self._dbe_copied:
            self.dbe, self._dbe_copied = dict(self.dbe), True
        if count:
            self.dbe[uuid] = count
        else:
            self.dbe.pop(uuid, None)
        key = f"ecc/{uuid}"
        fault = self.faults.get(key)
        if count > known and fault is None:
            labels = now.labels()
            fault = Fault(
                since=self.ts, last=self.end, firing=True, labels=labels, value=float(count)
            )
            self.fire("ecc", key, fault, self.ts)
        elif count == 0 and fault is not None:
            self.end_fault("ecc", key, fault)

    def _throttle(self, uuid: GpuUuid, reasons: tuple[str, ...], now: _Now) -> None:
        key = f"throttle/{uuid}"
        fault = self.faults.get(key)
        active = {r for r in reasons if r in SLOWDOWNS}
        if not active:
            if fault is not None:
                self.end_fault("throttle", key, fault, "slowdown ended")
            return
        if fault is None:
            fault = Fault(since=self.ts, last=self.end, labels=now.labels())
        seen = set(fault.labels.get("reasons", "").split(",")) - {""}
        labels = fault.labels | {"reasons": ",".join(sorted(seen | active))}
        fault = msgspec.structs.replace(fault, last=self.end, labels=labels)
        if not fault.firing and self.end - fault.since >= self.throttle_ms:
            labels = now.labels() | {"reasons": labels["reasons"]}
            fault = msgspec.structs.replace(fault, firing=True, labels=labels)
            self.fire("throttle", key, fault, fault.since + self.throttle_ms)
        else:
            self.put(key, fault)


def health_step(
    faults: dict[str, Fault],
    dbe: dict[GpuUuid, int],
    sample: NvmlSample,
    index: AllocationIndex,
    *,
    hold_ms: int,
    throttle_ms: int,
) -> tuple[dict[str, Fault], dict[GpuUuid, int], list[Alert]]:
    """Apply one node sample to the node's faults and last DBE counts (the same objects
    when the sample shows nothing and nothing is open): the faults, counts and messages.

    A GPU entry with no health reading (null) changes nothing of its faults: unknown is
    not healthy. Xid faults whose hold has passed by the sample's time resolve first; a
    slowdown of a GPU the sample no longer lists ends.
    """
    expired: list[Alert] = []
    if faults:
        faults, expired = health_expired(faults, sample.ts, hold_ms)
    elif not dbe:
        for gpu in sample.gpus:  # the common case, kept cheap: a healthy node, nothing open
            rows = gpu.remapped_rows
            if gpu.xid_errors or gpu.ecc_dbe or gpu.throttle_reasons or (rows and rows.failed):
                break
        else:
            return faults, dbe, expired
    step = _Step(faults, dbe, sample, index, throttle_ms)
    for gpu in sample.gpus:
        step.gpu(gpu)
    if step.faults:
        listed = {gpu.uuid for gpu in sample.gpus}
        for key in sorted(step.faults):
            if key.startswith("throttle/") and _uuid(key) not in listed:
                step.end_fault("throttle", key, step.faults[key], "no longer reported")
    return step.faults, step.dbe, expired + step.out


def _uuid(key: str) -> str:
    return key.split("/", 2)[1]


def health_expired(
    faults: dict[str, Fault], now_ms: int, hold_ms: int
) -> tuple[dict[str, Fault], list[Alert]]:
    """Resolve the Xid faults whose last report is `hold_ms` or more before `now_ms`, at
    the moment the hold ran out, in key order."""
    due = sorted(
        k for k, f in faults.items() if k.startswith("xid/") and f.last + hold_ms <= now_ms
    )
    if not due:
        return faults, []
    held = f"{hold_ms // _MS} s"
    out = [
        _message("xid", k, faults[k], faults[k].last + hold_ms, firing=False, why=held) for k in due
    ]
    return {k: f for k, f in faults.items() if k not in due}, out


def health_removed(faults: dict[str, Fault], ts: int) -> list[Alert]:
    """The resolved messages of every firing fault of a node removed from the cluster."""
    out = []
    for key, fault in sorted(faults.items()):
        if fault.firing:
            kind = key.split("/", 1)[0]
            out.append(_message(kind, key, fault, ts, firing=False, why="node removed"))
    return out


def health_firing(faults: dict[str, Fault], throttle_ms: int) -> Iterable[Alert]:
    """The firing messages, as sent, of the faults that fire (a restored state's)."""
    for key, fault in sorted(faults.items()):
        if fault.firing:
            kind = key.split("/", 1)[0]
            ts = fault.since + throttle_ms if kind == "throttle" else fault.since
            yield _message(kind, key, fault, ts, firing=True)
