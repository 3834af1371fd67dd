"""`gpuwatch top`'s capacity line and a fragmentation-blocked pod's reason, on hand-made rows
and on the JSON the Redis sink stores."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import msgspec
from rich.console import Console

from gpuwatch.harness.examples import example
from gpuwatch.tables import plain_lines
from gpuwatch.top.as_json import (
    render_json,
)
from gpuwatch.top.capacity import CapacityRow, capacity_line, parse_capacity
from gpuwatch.top.text import (
    fit_screen,
    frame,
    render_text,
)
from gpuwatch.top.view import (
    AlertRow,
    Header,
    PodRow,
    Query,
    Snapshot,
    clusters,
)
from schemas.capacity import Capacity
from sinks.redis.plan import plan

NOW = 1_764_412_800_000
HEADER = Header(target="redis://127.0.0.1:6379/0", prefix="gpuwatch:")
H100 = "NVIDIA H100 80GB HBM3"

FRAGMENTED = CapacityRow(
    model=H100, resource="nvidia.com/gpu", ts=NOW - 5000, free=6, stranded=6, reclaimable=1,
    queued=1, blocked=1, free_by_node={"h100-1": 2, "h100-2": 2, "h100-3": 2},
)  # fmt: skip
L40S = CapacityRow(model="L40S", resource="nvidia.com/gpu", free=3, free_by_node={"l40s-1": 3})
FULL = CapacityRow(model="A100", resource="nvidia.com/gpu")  # nothing free, nothing waiting
MIG = CapacityRow(model=H100, resource="nvidia.com/mig-1g.10gb", free=7)

BIG = PodRow(
    uid="uid-big", namespace="ml", pod="big-train-0", state="queued",
    state_since=NOW - 300_000, reason="Unschedulable", labels={"team": "vision"},
)  # fmt: skip
BLOCK = AlertRow(
    fingerprint="fp-frag",
    name="PodBlockedByFragmentation",
    severity="warning",
    since=NOW - 240_000,
    summary="ml/big-train-0 wants 4 nvidia.com/gpu: best node h100-2 has 2 free, "
    "6 free over the nodes it could use",
    subject_kind="pod",
    subject_uid="uid-big",
    labels={
        "namespace": "ml",
        "pod": "big-train-0",
        "resource": "nvidia.com/gpu",
        "models": "any",
        "wanted": "4",
        "best_node": "h100-2",
        "best_free": "2",
        "fleet_free": "6",
    },
    value=4.0,
)
ONE = Snapshot(
    pods=(BIG,),
    alerts=(BLOCK,),
    capacity=(FRAGMENTED, FULL, L40S),
    pod_names={BIG.uid: BIG.name},
    state_counts={"queued": 1},
    max_rows=3000,
)


def lines(text: str) -> list[str]:
    return text.split("\n")


def test_the_capacity_line_is_under_the_header_with_one_entry_per_model_that_says_something() -> (
    None
):
    text = lines(render_text(ONE, Query(), HEADER, NOW))
    assert text[1].startswith("pods: ")
    assert text[2] == (
        "capacity: L40S free 3  |  "
        "NVIDIA H100 80GB HBM3 free 6 (stranded 6) · reclaimable 1 · blocked 1"
    )
    assert text[3] == ""


def test_an_entry_names_what_it_has_and_a_mig_profile_after_its_model() -> None:
    assert capacity_line([MIG]) == "capacity: NVIDIA H100 80GB HBM3 nvidia.com/mig-1g.10gb free 7"
    waiting = replace(FULL, reclaimable=2, blocked=0)
    assert capacity_line([waiting]) == "capacity: A100 free 0 · reclaimable 2"
    assert capacity_line([FULL]) == "capacity: none free"
    assert capacity_line([], "east") == "capacity east: none free"


def test_no_capacity_records_no_line() -> None:
    text = render_text(replace(ONE, capacity=()), Query(), HEADER, NOW)
    assert "capacity" not in text


def test_a_blocked_queued_pod_says_so_in_its_reason() -> None:
    text = render_text(ONE, Query(), HEADER, NOW)
    (row,) = [line for line in lines(text) if line.startswith("ml/big-train-0")]
    assert "Unschedulable; blocked: wants 4, best node 2, 6 free" in row


def test_a_block_outliving_the_queue_is_not_a_running_pods_reason() -> None:
    running = replace(BIG, state="running", reason="")
    text = render_text(replace(ONE, pods=(running,)), Query(), HEADER, NOW)
    (row,) = [line for line in lines(text) if line.startswith("ml/big-train-0")]
    assert "blocked" not in row


def test_clusters_have_a_capacity_line_each_and_cluster_keeps_one() -> None:
    east = replace(FRAGMENTED, cluster="east")
    west = replace(L40S, cluster="west")
    snapshot = replace(ONE, pods=(), alerts=(), capacity=(east, west))
    assert clusters(snapshot) == ["east", "west"]
    text = lines(render_text(snapshot, Query(), HEADER, NOW))
    assert text[2:5] == [
        "clusters: east west",
        "capacity east: NVIDIA H100 80GB HBM3 free 6 (stranded 6) · reclaimable 1 · blocked 1",
        "capacity west: L40S free 3",
    ]
    text = lines(render_text(snapshot, Query(cluster="west"), HEADER, NOW))
    assert [line for line in text if line.startswith("capacity")] == ["capacity west: L40S free 3"]
    doc = json.loads(render_json(snapshot, Query(cluster="west"), HEADER, NOW))
    assert [(c["cluster"], c["model"]) for c in doc["capacity"]] == [("west", "L40S")]


def test_a_long_capacity_line_is_cut_to_the_terminal_like_any_other() -> None:
    many = tuple(replace(L40S, model=f"model-{i:02d}") for i in range(20))
    view = frame(replace(ONE, capacity=many), Query(), HEADER, NOW)
    shown = plain_lines(fit_screen(Console(file=io.StringIO()), view, 80, 40))
    assert shown[2].startswith("capacity: model-00 free 3  |  model-01 free 3")
    assert max(len(line) for line in shown) <= 80


def test_json_has_the_capacity_and_each_blocked_pods_figures() -> None:
    doc = json.loads(render_json(ONE, Query(), HEADER, NOW))
    assert [(c["model"], c["free"]) for c in doc["capacity"]] == [
        ("A100", 0), ("L40S", 3), (H100, 6)
    ]  # fmt: skip
    assert doc["capacity"][2] == {
        "cluster": "default", "model": H100, "resource": "nvidia.com/gpu", "ts": NOW - 5000,
        "free": 6, "stranded": 6, "reclaimable": 1, "queued": 1, "blocked": 1,
        "free_by_node": {"h100-1": 2, "h100-2": 2, "h100-3": 2}, "reclaimable_gpus": [],
    }  # fmt: skip
    (pod,) = doc["pods"]
    assert pod["reason"] == "Unschedulable"
    assert pod["blocked"] == {
        "resource": "nvidia.com/gpu", "models": "any", "best_node": "h100-2",
        "wanted": 4, "best_free": 2, "fleet_free": 6, "since": NOW - 240_000,
        "summary": BLOCK.summary,
    }  # fmt: skip


def test_the_json_the_redis_sink_stores_is_read_back_whole() -> None:
    record = msgspec.convert(example("gpuwatch.capacity/v1") | {"cluster": "east"}, Capacity)
    (command,) = plan([record])
    row = parse_capacity(command.args[2])
    assert row == CapacityRow(
        model=H100, resource="nvidia.com/gpu", ts=record.ts, free=6, stranded=6,
        reclaimable=1, queued=1, blocked=1,
        free_by_node={"gpu-node-17": 2, "gpu-node-18": 2, "gpu-node-19": 2},
        reclaimable_gpus=(example("gpuwatch.capacity/v1")["reclaimable_gpus"][0],),
        cluster="east",
    )  # fmt: skip
    default = parse_capacity(json.dumps(example("gpuwatch.capacity/v1")))
    assert default is not None
    assert default.cluster == "default"


def test_unreadable_capacity_values_are_no_rows() -> None:
    assert parse_capacity("{") is None
    assert parse_capacity("[1]") is None
    assert parse_capacity(json.dumps({"model": "H100"})) is None  # no resource
    odd = parse_capacity(json.dumps({"model": "H100", "resource": "r", "free": "x"}))
    assert odd is not None
    assert (odd.free, odd.free_by_node, odd.reclaimable_gpus) == (0, {}, ())
