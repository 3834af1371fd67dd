"""Firing alerts as series: fire, refresh, resolve, replays, forget on revoke, the cap."""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
from support.metric_records import T0, S, gpu, series, value, worker

from gpuwatch.harness.examples import example
from schemas.alert import Alert
from schemas.nvml_sample import NvmlSample
from schemas.settings import RuleSettings
from sinks.prometheus.collector import ALERT_LABELS, exposition
from sinks.prometheus.metrics import WorkerMetrics
from streams.core.node.gpu_alerts import on_sample

FIRING = "gpuwatch_alert_firing"
SINCE = "gpuwatch_alert_firing_since_seconds"
# Every label of an alert series, empty where it does not apply; the default cluster's
# series have no `cluster` label at all.
EMPTY = dict.fromkeys((name for name in ALERT_LABELS if name != "cluster"), "")


def alert(
    name: str = "GpuIdleAllocated",
    status: str = "firing",
    ts: int = T0,
    *,
    fingerprint: str = "f1",
    since: int = T0 - 60 * S,
    labels: dict[str, str] | None = None,
    subject: dict[str, Any] | None = None,
    severity: str = "warning",
) -> Alert:
    """An alert message (by default a GPU-1 on n1 idle alert held by ml/train-0)."""
    raw = example("gpuwatch.alert/v1") | {
        "name": name, "status": status, "ts": ts, "fingerprint": fingerprint, "since": since,
        "severity": severity,
        "labels": labels if labels is not None else
        {"node": "n1", "gpu": "GPU-1", "model": "H100", "namespace": "ml", "pod": "train-0"},
        "subject": subject or {"kind": "gpu", "uid": None, "uuid": "GPU-1", "node": "n1"},
    }  # fmt: skip
    return msgspec.convert(raw, Alert)


def stalled(uid: str, ts: int, status: str = "firing", node: str = "n1") -> Alert:
    """A PodStalled message of pod `uid` (ml/job-<uid>, team vision) on `node`."""
    labels = {"namespace": "ml", "pod": f"job-{uid}", "team": "vision", "node": node}
    subject = {"kind": "pod", "uid": uid, "uuid": None, "node": node}
    return alert("PodStalled", status, ts, fingerprint=f"s-{uid}", labels=labels, subject=subject)


def firing(metrics: WorkerMetrics) -> list[dict[str, str]]:
    """The firing series' label sets, empty labels left out, sorted."""
    found = [{k: v for k, v in labels.items() if v} for labels in series(metrics, FIRING)]
    return sorted(found, key=lambda labels: sorted(labels.items()))


IDLE = {"alertname": "GpuIdleAllocated", "severity": "warning", "namespace": "ml",
        "pod": "train-0", "node": "n1", "gpu": "GPU-1", "model": "H100"}  # fmt: skip


def test_a_firing_alert_is_one_series_of_1_with_its_start_in_epoch_seconds() -> None:
    metrics = worker()
    metrics.observe_alert(alert(since=T0 - 60 * S))
    assert firing(metrics) == [IDLE]
    labels = EMPTY | IDLE
    assert value(metrics, FIRING, **labels) == 1.0
    assert value(metrics, SINCE, **labels) == (T0 - 60 * S) / 1000
    assert value(metrics, "gpuwatch_metrics_tracked", kind="alert") == 1
    text = exposition(metrics.registry).decode()
    assert f'{FIRING}{{alertname="GpuIdleAllocated",severity="warning",namespace="ml",' in text


def test_resolving_removes_the_series_and_a_replayed_firing_message_does_not_revive_it() -> None:
    metrics = worker()
    metrics.observe_alert(alert(ts=T0))
    metrics.observe_alert(alert(status="resolved", ts=T0 + 30 * S))
    assert firing(metrics) == []
    metrics.observe_alert(alert(ts=T0))  # at-least-once: the firing message again
    assert firing(metrics) == []
    assert value(metrics, "gpuwatch_metrics_tracked", kind="alert") == 0


def test_at_one_event_time_resolved_wins_over_firing_in_either_order() -> None:
    for first, second in itertools.permutations(("firing", "resolved")):
        metrics = worker()
        metrics.observe_alert(alert(status=first, ts=T0))
        metrics.observe_alert(alert(status=second, ts=T0))
        assert firing(metrics) == [], (first, second)


def test_a_refresh_replaces_the_series_and_an_older_message_changes_nothing() -> None:
    metrics = worker()
    metrics.observe_alert(alert(ts=T0, since=T0 - 60 * S))
    moved = {"node": "n1", "gpu": "GPU-1", "model": "H100", "namespace": "ml", "pod": "train-1"}
    metrics.observe_alert(alert(ts=T0 + 10 * S, since=T0 - 50 * S, labels=moved))
    metrics.observe_alert(alert(ts=T0 + 5 * S, since=T0 - 99 * S))
    assert firing(metrics) == [IDLE | {"pod": "train-1"}]
    assert value(metrics, SINCE, **EMPTY | IDLE | {"pod": "train-1"}) == (T0 - 50 * S) / 1000


def test_fire_resolve_and_fire_again_end_as_the_latest_message_says_in_any_order() -> None:
    history = [
        alert(ts=T0),
        alert(status="resolved", ts=T0 + 10 * S),
        alert(ts=T0 + 20 * S, since=T0),
    ]
    for order in itertools.permutations(history):
        metrics = worker()
        for message in order:
            metrics.observe_alert(message)
        assert firing(metrics) == [IDLE]
        assert value(metrics, SINCE, **EMPTY | IDLE) == T0 / 1000
    for order in itertools.permutations(history[:2]):
        metrics = worker()
        for message in order:
            metrics.observe_alert(message)
        assert firing(metrics) == []


def test_a_gpu_shared_by_two_pods_has_a_series_per_pod_and_resolves_both() -> None:
    metrics = worker()
    labels = {"node": "n7", "gpu": "GPU-7", "model": "L4", "pods": "research/nb-a,research/nb-b"}
    metrics.observe_alert(alert(labels=labels))
    shared = {"alertname": "GpuIdleAllocated", "severity": "warning", "namespace": "research",
              "node": "n7", "gpu": "GPU-7", "model": "L4"}  # fmt: skip
    assert firing(metrics) == [shared | {"pod": "nb-a"}, shared | {"pod": "nb-b"}]
    assert value(metrics, "gpuwatch_metrics_tracked", kind="alert") == 2
    metrics.observe_alert(alert(status="resolved", ts=T0 + S, labels=labels))
    assert firing(metrics) == []


def test_a_gpu_fault_carries_each_holders_workload_owner() -> None:
    metrics = worker()
    one = {"node": "n1", "gpu": "GPU-1", "model": "H100", "xid": "79", "namespace": "ml",
           "pod": "train-0", "pod_uid": "u0", "owner": "Job/train"}  # fmt: skip
    metrics.observe_alert(alert("GpuXidError", labels=one, severity="critical"))
    two = {"node": "n2", "gpu": "GPU-2", "model": "L4", "xid": "79",
           "pods": "dev/a-0,dev/b-0", "pod_uids": "ua,ub", "owners": "Deployment/a,"}  # fmt: skip
    metrics.observe_alert(alert("GpuXidError", fingerprint="f2", labels=two, severity="critical"))
    xid = {"alertname": "GpuXidError", "severity": "critical", "xid": "79"}
    shared = xid | {"namespace": "dev", "node": "n2", "gpu": "GPU-2", "model": "L4"}
    assert firing(metrics) == [
        xid | {"namespace": "ml", "pod": "train-0", "node": "n1", "gpu": "GPU-1",
               "model": "H100", "pod_uid": "u0", "owner": "Job/train"},
        shared | {"pod": "a-0", "pod_uid": "ua", "owner": "Deployment/a"},
        shared | {"pod": "b-0", "pod_uid": "ub"},  # its owner is not known
    ]  # fmt: skip


def test_two_unnamed_pods_on_one_gpu_stay_apart_by_pod_uid() -> None:
    metrics = worker()
    for uid in ("uid-a", "uid-b"):
        labels = {"node": "n1", "gpu": "GPU-1", "model": "H100", "pod_uid": uid, "pids": "7"}
        metrics.observe_alert(
            alert("GpuUnallocatedAccess", fingerprint=uid, labels=labels, severity="critical")
        )
    leak = {"alertname": "GpuUnallocatedAccess", "severity": "critical", "node": "n1",
            "gpu": "GPU-1", "model": "H100"}  # fmt: skip
    assert firing(metrics) == [leak | {"pod_uid": "uid-a"}, leak | {"pod_uid": "uid-b"}]


def test_pod_and_node_alerts_carry_their_subject() -> None:
    metrics = worker()
    metrics.observe_alert(stalled("u1", T0))
    node = {"kind": "node", "uid": None, "uuid": None, "node": "n9"}
    metrics.observe_alert(
        alert("NodeTelemetryMissing", fingerprint="n9", labels={"node": "n9"}, subject=node,
              severity="critical")
    )  # fmt: skip
    assert firing(metrics) == [
        {"alertname": "NodeTelemetryMissing", "severity": "critical", "node": "n9"},
        {"alertname": "PodStalled", "severity": "warning", "namespace": "ml", "pod": "job-u1",
         "team": "vision", "node": "n1", "pod_uid": "u1"},
    ]  # fmt: skip


def test_a_revoke_forgets_what_its_partitions_own_and_a_re_fed_message_comes_back() -> None:
    metrics = worker()
    leak_labels = {"node": "n2", "gpu": "GPU-2", "model": "H100", "pod_uid": "u9", "pids": "7"}
    messages = [
        alert(),  # GPU-1 on n1
        alert("GpuUnallocatedAccess", fingerprint="leak", labels=leak_labels, severity="critical",
              subject={"kind": "gpu", "uid": None, "uuid": "GPU-2", "node": "n2"}),
        stalled("u1", T0, node="n1"),
        stalled("u2", T0, node="n2"),
    ]  # fmt: skip
    for message in messages:
        metrics.observe_alert(message)
    metrics.forget(nodes=["n1"])  # the node's alerts, not those of the pods on it
    assert [s["pod"] or s["gpu"] for s in series(metrics, FIRING)] == ["GPU-2", "job-u1", "job-u2"]
    metrics.forget(pods=["u2"], gpus=["GPU-2"])
    assert [s["pod"] for s in series(metrics, FIRING)] == ["job-u1"]
    assert value(metrics, "gpuwatch_metrics_tracked", kind="alert") == 1
    for message in messages:  # the partitions come back and their firing alerts are re-fed
        metrics.observe_alert(message)
    assert len(series(metrics, FIRING)) == 4


def test_the_cap_refuses_series_and_counts_them_and_a_resolve_makes_room() -> None:
    metrics = worker(max_alert_series=2)
    for uid in ("u1", "u2", "u3"):
        metrics.observe_alert(stalled(uid, T0))
    assert [s["pod"] for s in series(metrics, FIRING)] == ["job-u1", "job-u2"]
    assert value(metrics, "gpuwatch_metrics_series_dropped_total", kind="alert") == 1
    metrics.observe_alert(stalled("u1", T0 + S, "resolved"))
    metrics.observe_alert(stalled("u3", T0 + 2 * S))
    assert [s["pod"] for s in series(metrics, FIRING)] == ["job-u2", "job-u3"]


def idle_sample(ts: int, holders: dict[str, tuple[str, str]]) -> NvmlSample:
    """Node n1 with GPU-1 at 1 %, allocated to each pod uid of `holders` (namespace, pod)."""
    raw = example("gpuwatch.nvml.sample/v1") | {"node": "n1", "ts": ts, "interval_ms": S}
    raw["gpus"] = [gpu("GPU-1", 1.0, sharing="time-slicing" if len(holders) > 1 else "exclusive")]
    alloc = raw["allocations"][0]
    raw["allocations"] = [
        alloc | {"pod_uid": uid, "namespace": ns, "pod": pod, "device_ids": ["GPU-1"]}
        for uid, (ns, pod) in holders.items()
    ]
    return msgspec.convert(raw, NvmlSample)


def test_the_streams_own_idle_alert_fires_and_resolves_the_series() -> None:
    metrics, state, rules = worker(), None, RuleSettings()
    holders = {"u1": ("ml", "train-0"), "u2": ("ml", "eval-0")}
    for t in range(3):
        state, out, _ = on_sample(state, idle_sample(T0 + t * S, holders), rules,
                                  idle_alert_after_s=3)  # fmt: skip
        for message in out:
            metrics.observe_alert(message)
    held = IDLE | {"model": gpu("GPU-1")["model"]}
    assert firing(metrics) == [held | {"pod": "eval-0"}, held]
    assert value(metrics, SINCE, **EMPTY | held) == T0 / 1000
    state, out, _ = on_sample(state, idle_sample(T0 + 3 * S, {}), rules, idle_alert_after_s=3)
    assert [m.status for m in out] == ["resolved"]
    metrics.observe_alert(out[0])
    assert firing(metrics) == []


def test_a_pod_blocked_by_fragmentation_is_a_pod_alert_series_until_resolved() -> None:
    """The capacity alert takes the pod alerts' way: the pod's series, its partition's."""
    labels = {
        "namespace": "ml", "pod": "big-train-0", "cluster": "east", "resource": "nvidia.com/gpu",
        "models": "NVIDIA-H100-80GB-HBM3", "wanted": "4", "best_node": "h100-2",
        "best_free": "2", "fleet_free": "6",
    }  # fmt: skip
    subject = {"kind": "pod", "uid": "u9", "uuid": None, "node": None}
    raw = msgspec.to_builtins(
        alert("PodBlockedByFragmentation", fingerprint="frag", labels=labels, subject=subject)
    )
    blocked = msgspec.convert(raw | {"cluster": "east", "value": 4.0}, Alert)
    metrics = worker()
    metrics.observe_alert(blocked)
    assert firing(metrics) == [
        {"alertname": "PodBlockedByFragmentation", "severity": "warning", "namespace": "ml",
         "pod": "big-train-0", "pod_uid": "u9", "cluster": "east"}
    ]  # fmt: skip
    metrics.forget(pods=["u9"])  # its partition went to another worker
    assert firing(metrics) == []
    metrics.observe_alert(blocked)
    metrics.observe_alert(msgspec.structs.replace(blocked, status="resolved", ts=T0 + S))
    assert firing(metrics) == []
