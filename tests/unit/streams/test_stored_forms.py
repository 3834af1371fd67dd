"""The stored forms of the per-pod integrals: declared once, and JSON that decodes across versions.

The per-pod integrals are the fields of `integrals.PodGpuIntegrals`, which every struct that
keeps them extends: a pod state's `GpuTotals` (pod-side changelog), a node document's
`GpuUsageAcc` (node-side changelog) and the transient `PodIntegrals`. The bytes a changelog
holds are pinned here, and so are the bytes of the previous layout (the per-GPU names
first): a changelog written by it decodes to the same state.
"""

from __future__ import annotations

import msgspec

from schemas.ids import GpuUuid, NodeName, PodUid
from schemas.pod_usage import GpuUsage
from streams.core.integrals import PodGpuIntegrals, PodIntegrals
from streams.core.node import node_doc
from streams.core.node.gpu_windows import GpuWindowAcc, PodWindowAcc
from streams.core.node.usage import GpuUsageAcc, PendingUsage, PodTrack
from streams.core.pod import pod_state
from streams.core.pod.pod_state import GpuTotals, OpenWindow, PodState

INTEGRALS = (
    "allocated_seconds",
    "used_gpu_seconds",
    "idle_seconds",
    "vram_byte_seconds",
    "vram_peak_bytes",
    "energy_joules",
    "cost_usd",
    "waste_usd",
)
"""A pod's integrals on one GPU."""
PER_GPU = ("uuid", "model", "sharing", "method")
GPU_A, POD_A, NODE = GpuUuid("GPU-a"), PodUid("pod-a"), NodeName("node-1")
TOTALS = {
    "allocated_seconds": 1.5,
    "used_gpu_seconds": 0.75,
    "idle_seconds": 0.25,
    "vram_byte_seconds": 2.0,
    "vram_peak_bytes": 3,
    "energy_joules": 4.0,
    "cost_usd": 0.5,
    "waste_usd": 0.125,
}
GPU = {"uuid": GPU_A, "model": "H100", "sharing": "exclusive", "method": "process"}
TOTALS_JSON = (
    b'"allocated_seconds":1.5,"used_gpu_seconds":0.75,"idle_seconds":0.25,'
    b'"vram_byte_seconds":2.0,"vram_peak_bytes":3,"energy_joules":4.0,"cost_usd":0.5,'
    b'"waste_usd":0.125'
)
GPU_JSON = b'"uuid":"GPU-a","model":"H100","sharing":"exclusive","method":"process"'


def names(struct: type[msgspec.Struct]) -> tuple[str, ...]:
    return struct.__struct_fields__


def test_every_per_pod_total_extends_the_one_declaration() -> None:
    assert names(PodGpuIntegrals) == INTEGRALS
    assert names(GpuUsageAcc) == (*INTEGRALS, *PER_GPU, "share_seconds")
    assert names(PodIntegrals) == (*INTEGRALS, "uid", "share_seconds", "method", "idle")
    # The pod side gets `share_mean` instead of `share_seconds`: a mean, not an integral.
    assert names(GpuTotals) == INTEGRALS + PER_GPU
    assert set(INTEGRALS) <= set(names(GpuUsage))


def _pod_state_json(gpu_totals: bytes, *, request: bool = True, revisable: bool = True) -> bytes:
    # The GPU request and models came later, and the windows kept for revision later still:
    # a state stored without them still loads.
    asked = b'"gpu_request":{},"gpu_products":null,' if request else b""
    kept = b'"revisable":[],' if revisable else b""
    return (
        b'{"uid":"pod-a","namespace":"","name":"","node":null,"labels":{},"owner":null,'
        b'"created_at":null,' + asked + b'"resource_version":null,"event_ts":null,"deleted":false,'
        b'"base":null,"base_reason":null,"crashloop":false,"idle_since":null,'
        b'"usage_until":null,"horizon":0,"state":null,"reason":null,"since":0,'
        b'"accrued_until":0,"stall_idle_since":null,"queued_ms":0,"running_ms":0,'
        b'"stalled_ms":0,"history":[],"windows":[{"start":60000,"gpus":[' + gpu_totals + b"]}],"
        b'"attributed_until":null,"closed_until":0,' + kept + b'"queued_alert_since":null,'
        b'"queued_alert_firing":false,"stalled_alert_since":null}'
    )


def test_a_pod_state_with_a_window_encodes_as_stored_and_decodes_the_previous_layout() -> None:
    totals = GpuTotals(**GPU, **TOTALS)
    state = PodState(uid=POD_A, windows=(OpenWindow(start=60000, gpus=(totals,)),))
    raw = pod_state.encode(state)
    assert raw == _pod_state_json(b"{" + TOTALS_JSON + b"," + GPU_JSON + b"}")
    assert pod_state.decode(raw) == state
    previous = _pod_state_json(
        b"{" + GPU_JSON + b"," + TOTALS_JSON + b"}", request=False, revisable=False
    )
    assert pod_state.decode(previous) == state


def _node_doc_json(gpu_usage: bytes) -> bytes:
    return (
        b'{"node":"node-1","windows":[{"uuid":"GPU-a","node":"node-1","model":"H100",'
        b'"parent_uuid":null,"window_start":0,"window_end":60000,"seconds":1.0,'
        b'"busy_seconds":2.0,"idle_seconds":3.0,"allocated_seconds":4.0,'
        b'"allocated_idle_seconds":5.0,"unallocated_seconds":6.0,"util_seconds":7.0,'
        b'"util_known_seconds":8.0,"attributed_seconds":9.0,"unattributed_seconds":10.0,'
        b'"pods":{"pod-a":{"uid":"pod-a","namespace":"ml","pod":"p","allocated_seconds":1.0,'
        b'"used_gpu_seconds":2.0,"share_seconds":3.0,"idle_seconds":4.0,'
        b'"vram_peak_bytes":5}}}],"tracks":[{"uid":"pod-a","node":"node-1","last_end":1000,'
        b'"idle_since":null,"pending":{"ts":0,"end_ts":1000,"window_start":0,"due":10000,'
        b'"samples":1,"gpus":{"GPU-a":' + gpu_usage + b"}}}]}"
    )


def test_a_node_document_with_a_window_and_a_track_encodes_as_stored() -> None:
    acc = GpuUsageAcc(**GPU, **TOTALS, share_seconds=0.5)
    pod = PodWindowAcc(POD_A, "ml", "p", 1.0, 2.0, 3.0, 4.0, 5)
    window = GpuWindowAcc(GPU_A, NODE, "H100", None, 0, 60000, *map(float, range(1, 11)))
    window.pods[POD_A] = pod
    pending = PendingUsage(0, 1000, 0, 10000, 1, {GPU_A: acc})
    doc = node_doc.NodeDoc(
        node=NODE, windows=[window], tracks=[PodTrack(POD_A, NODE, 1000, None, pending)]
    )
    raw = node_doc.encode(doc)
    assert raw == _node_doc_json(b"{" + TOTALS_JSON + b"," + GPU_JSON + b',"share_seconds":0.5}')
    assert node_doc.decode_doc(raw) == doc
    previous = _node_doc_json(
        b'{"uuid":"GPU-a","model":"H100","sharing":"exclusive","method":"process",'
        b'"allocated_seconds":1.5,"used_gpu_seconds":0.75,"share_seconds":0.5,'
        b'"idle_seconds":0.25,"vram_byte_seconds":2.0,"vram_peak_bytes":3,'
        b'"energy_joules":4.0,"cost_usd":0.5,"waste_usd":0.125}'
    )
    assert node_doc.decode_doc(previous) == doc
