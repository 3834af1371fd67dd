"""`gpuwatch top` rendering on hand-made rows: cells, order, filters, limit, text and JSON."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console, Group, RenderableType
from rich.text import Text

from gpuwatch.tables import plain_lines
from gpuwatch.top.as_json import (
    render_json,
)
from gpuwatch.top.cells import (
    fmt_age,
    fmt_bytes,
    fmt_pct,
    fmt_usd,
    short_uuid,
)
from gpuwatch.top.text import (
    fit_screen,
    frame,
    render_text,
)
from gpuwatch.top.view import (
    AlertRow,
    GpuRow,
    Header,
    PodRow,
    Query,
    Snapshot,
    notes,
    select,
)

NOW = 1_764_412_800_000  # 2025-11-29 10:40:00 UTC
GIB = 1 << 30
GPU_0 = "GPU-8f3c2a1e-5b7d-4c9a-8e6f-1d2b3c4a5e6f"
GPU_1 = "GPU-2b9e7c44-a1d0-4f3b-9c55-7e8d1a2b3c4d"
GPU_2 = "GPU-77aa0c11-0000-4000-8000-000000000002"
EIGHT = tuple(f"GPU-{i}{i}{i}{i}{i}{i}{i}{i}-0000" for i in range(8))

TRAIN = PodRow(
    uid="aaaaaaaa-1",
    namespace="ml",
    pod="train-0",
    state="stalled",
    state_since=NOW - 600_000,
    reason="Idle",
    node="gpu-node-17",
    labels={"team": "vision", "project": "llm"},
    gpus=(GPU_0,),
    share=0.02,
    vram_bytes=57 * GIB,
    cost_usd=1.1,
    waste_usd=0.4,
)
NOTEBOOK = PodRow(
    uid="bbbbbbbb-2",
    namespace="research",
    pod="notebook-ana-0",
    state="running",
    state_since=NOW - 1_800_000,
    node="gpu-node-17",
    labels={"team": "nlp"},
    gpus=(GPU_1,),
    share=0.9,
    vram_bytes=20 * GIB,
    cost_usd=2.0,
    waste_usd=0.05,
)
EVAL = PodRow(
    uid="cccccccc-3",
    namespace="ml",
    pod="eval-3",
    state="queued",
    state_since=NOW - 125_000,
    reason="Unschedulable",
    labels={"team": "vision"},
)
OLD = PodRow(
    uid="dddddddd-4",
    namespace="ml",
    pod="old-1",
    state="finished",
    state_since=NOW - 3_700_000,
    reason="Completed",
    node="gpu-node-02",
    gpus=EIGHT,
    share=0.5,
    vram_bytes=GIB,
    cost_usd=3.0,
    waste_usd=0.2,
)
PODS = (NOTEBOOK, EVAL, TRAIN, OLD)  # not in any order the view uses

GPUS = (
    GpuRow(
        uuid=GPU_0,
        node="gpu-node-17",
        model="NVIDIA H100 80GB HBM3",
        util_pct=1.0,
        mem_used_bytes=57 * GIB,
        mem_total_bytes=80 * GIB,
        owners=(TRAIN.uid,),
        idle_since=NOW - 720_000,
        updated_at=NOW - 3000,
    ),
    GpuRow(
        uuid=GPU_1,
        node="gpu-node-17",
        model="NVIDIA H100 80GB HBM3",
        util_pct=85.0,
        mem_used_bytes=20 * GIB,
        mem_total_bytes=80 * GIB,
        owners=(NOTEBOOK.uid, "zzzzzzzz-unknown"),
        updated_at=NOW - 3000,
    ),
    GpuRow(uuid=GPU_2, node="gpu-node-02", model="L40S"),
)

STALLED = AlertRow(
    fingerprint="fp-stall",
    name="PodStalled",
    severity="warning",
    since=NOW - 600_000,
    summary="ml/train-0 idle for 5m",
    subject_kind="pod",
    subject_uid=TRAIN.uid,
    subject_node="gpu-node-17",
    labels={"namespace": "ml", "team": "vision"},
    value=300.0,
)
IDLE = AlertRow(
    fingerprint="fp-idle",
    name="GpuIdleAllocated",
    severity="critical",
    since=NOW - 1_800_000,
    summary="GPU GPU-8f3c2a1e on gpu-node-17 allocated and idle for 30m",
    subject_kind="gpu",
    subject_uuid=GPU_0,
    subject_node="gpu-node-17",
    labels={"namespace": "ml", "gpu": GPU_0},
)
SILENT = AlertRow(
    fingerprint="fp-node",
    name="NodeTelemetryMissing",
    severity="warning",
    since=NOW - 60_000,
    summary="no samples from gpu-node-02 for 60s",
    subject_kind="node",
    subject_node="gpu-node-02",
    labels={"node": "gpu-node-02"},
)

SNAPSHOT = Snapshot(
    pods=PODS,
    gpus=GPUS,
    alerts=(SILENT, STALLED, IDLE),
    pod_names={p.uid: p.name for p in PODS},
    state_counts={"queued": 1, "running": 1, "stalled": 1, "finished": 1},
    gpus_total=3,
    max_rows=3000,
)
HEADER = Header(target="redis://127.0.0.1:6379/0", prefix="gpuwatch:")


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (59_999, "59s"),
        (60_000, "1m00s"),
        (125_000, "2m05s"),
        (3_599_000, "59m59s"),
        (3_600_000, "1h00m"),
        (3_700_000, "1h01m"),
        (86_399_000, "23h59m"),
        (90_061_000, "1d01h"),
        (-5000, "0s"),  # clocks go backwards: never a negative age
    ],
)
def test_ages(ms: int, text: str) -> None:
    assert fmt_age(ms) == text


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (None, "-"),
        (0, "0"),
        (1023, "1023"),
        (1536, "1.5Ki"),
        (61_203_283_968, "57.0Gi"),
        (85_520_809_984, "79.6Gi"),
        (2 << 40, "2.0Ti"),
    ],
)
def test_bytes(n: int | None, text: str) -> None:
    assert fmt_bytes(n) == text


def test_money_percent_and_uuid_cells() -> None:
    assert [fmt_usd(v) for v in (0.0, 0.0033, 0.99994, 1.1, 1234.567)] == [
        "0.0000",
        "0.0033",
        "0.9999",
        "1.10",
        "1234.57",
    ]
    assert [fmt_pct(v) for v in (None, 0.4, 87.0, 100.0)] == ["-", "0%", "87%", "100%"]
    assert short_uuid(GPU_0) == "GPU-8f3c2a1e"
    assert short_uuid("MIG-1a2b3c4d-0000") == "MIG-1a2b3c4d"


def names(snapshot: Snapshot, query: Query) -> list[str]:
    return [p.name for p in select(snapshot, query).pods]


@pytest.mark.parametrize(
    ("sort", "expected"),
    [
        ("waste", ["ml/train-0", "ml/old-1", "research/notebook-ana-0", "ml/eval-3"]),
        ("cost", ["ml/old-1", "research/notebook-ana-0", "ml/train-0", "ml/eval-3"]),
        ("vram", ["ml/train-0", "research/notebook-ana-0", "ml/old-1", "ml/eval-3"]),
        ("share", ["research/notebook-ana-0", "ml/old-1", "ml/train-0", "ml/eval-3"]),
        ("state", ["ml/train-0", "ml/eval-3", "research/notebook-ana-0", "ml/old-1"]),
        ("name", ["ml/eval-3", "ml/old-1", "ml/train-0", "research/notebook-ana-0"]),
    ],
)
def test_each_sort_orders_the_pods(sort: str, expected: list[str]) -> None:
    assert names(SNAPSHOT, Query(sort=sort)) == expected  # type: ignore[arg-type]


def test_ties_go_by_name_and_state_sort_puts_the_longest_in_state_first() -> None:
    twin = replace(TRAIN, uid="eeeeeeee-5", namespace="dev", pod="x")  # same waste and cost
    later = replace(TRAIN, uid="ffffffff-6", pod="a-later", state_since=NOW - 1000)
    snapshot = replace(SNAPSHOT, pods=(TRAIN, later, twin))
    assert names(snapshot, Query(sort="waste")) == ["dev/x", "ml/a-later", "ml/train-0"]
    assert names(snapshot, Query(sort="state")) == ["dev/x", "ml/train-0", "ml/a-later"]


def test_filters_narrow_pods_and_with_them_gpus_and_alerts() -> None:
    ml = select(SNAPSHOT, Query(namespace="ml"))
    assert [p.name for p in ml.pods] == ["ml/train-0", "ml/old-1", "ml/eval-3"]
    assert [g.uuid for g in ml.gpus] == [GPU_0]  # the only GPU an ml pod owns
    assert [a.name for a in ml.alerts] == ["GpuIdleAllocated", "PodStalled"]

    nlp = select(SNAPSHOT, Query(team="nlp"))
    assert [p.name for p in nlp.pods] == ["research/notebook-ana-0"]
    assert [g.uuid for g in nlp.gpus] == [GPU_1]
    assert nlp.alerts == ()

    stalled = select(SNAPSHOT, Query(state="stalled"))
    assert [p.name for p in stalled.pods] == ["ml/train-0"]
    assert [a.name for a in stalled.alerts] == ["PodStalled"]
    assert select(SNAPSHOT, Query(state="finished")).gpus == ()

    both = select(SNAPSHOT, Query(namespace="ml", team="nlp"))
    assert (both.pods, both.gpus, both.alerts) == ((), (), ())


def test_without_filters_gpus_go_by_node_and_alerts_by_severity_then_age() -> None:
    view = select(SNAPSHOT, Query())
    assert [g.uuid for g in view.gpus] == [GPU_2, GPU_1, GPU_0]  # gpu-node-02 first, then uuid
    assert [a.fingerprint for a in view.alerts] == ["fp-idle", "fp-stall", "fp-node"]


def test_limit_cuts_each_table_and_keeps_the_matched_counts() -> None:
    view = select(SNAPSHOT, Query(limit=2))
    assert [p.name for p in view.pods] == ["ml/train-0", "ml/old-1"]
    assert (len(view.gpus), len(view.alerts)) == (2, 2)
    assert (view.pods_matched, view.gpus_matched, view.alerts_matched) == (4, 3, 3)
    text = render_text(SNAPSHOT, Query(limit=2), HEADER, NOW)
    assert text.count("(2 more; raise --limit)") == 1  # pods: 4 matched, 2 shown
    assert text.count("(1 more; raise --limit)") == 2  # GPUs 3/2, alerts 3/2


EXPECTED = (Path(__file__).parent / "expected_top.txt").read_text(encoding="utf-8")


def test_text_tables_line_by_line() -> None:
    assert render_text(SNAPSHOT, Query(), HEADER, NOW) == EXPECTED


def test_text_is_plain_and_says_the_filters() -> None:
    text = render_text(SNAPSHOT, Query(sort="cost", namespace="ml", state="stalled"), HEADER, NOW)
    assert "\x1b" not in text
    assert "sort cost  --namespace ml  --state stalled" in text.splitlines()[1]
    assert "PODS (1)" in text


def test_empty_redis_prints_empty_tables_and_the_hint() -> None:
    text = render_text(Snapshot(max_rows=3000), Query(), HEADER, NOW)
    lines = text.splitlines()
    assert lines.count("(none)") == 3
    assert lines[3:5] == [
        "PODS (0)",
        "POD  TEAM  STATE  REASON  FOR  SHARE  VRAM  COST $  WASTE $  GPUS",
    ]
    assert lines[-1] == (
        "note: nothing written under 'gpuwatch:' in redis://127.0.0.1:6379/0 yet: "
        "is the worker running (`gpuwatch worker`)?"
    )


def test_a_filter_that_matches_nothing_is_not_an_empty_redis() -> None:
    assert notes(SNAPSHOT, HEADER) == []
    text = render_text(SNAPSHOT, Query(team="nobody"), HEADER, NOW)
    assert "PODS (0)" in text
    assert "nothing written" not in text


def test_left_out_rows_are_noted() -> None:
    snapshot = replace(SNAPSHOT, pods_left_out=1200, gpus_left_out=7, max_rows=3000)
    assert notes(snapshot, HEADER) == [
        "1200 pods left out: read at most 3000 per refresh (--max-rows)",
        "7 GPUs left out: read at most 3000 per refresh (--max-rows)",
    ]


def test_json_has_the_rows_in_order_with_raw_numbers() -> None:
    doc = json.loads(render_json(SNAPSHOT, Query(limit=3), HEADER, NOW))
    assert doc["at"] == NOW
    assert (doc["redis"], doc["prefix"], doc["sort"], doc["limit"]) == (
        "redis://127.0.0.1:6379/0",
        "gpuwatch:",
        "waste",
        3,
    )
    assert doc["counts"] == {
        "states": {"stalled": 1, "queued": 1, "running": 1, "finished": 1},
        "pods_matched": 4,
        "pods_left_out": 0,
        "gpus": 3,
        "gpus_matched": 3,
        "gpus_left_out": 0,
        "alerts_firing": 3,
        "alerts_matched": 3,
    }
    assert [p["pod"] for p in doc["pods"]] == ["train-0", "old-1", "notebook-ana-0"]
    first = doc["pods"][0]
    assert first == {
        "uid": "aaaaaaaa-1",
        "cluster": "default",
        "namespace": "ml",
        "pod": "train-0",
        "team": "vision",
        "labels": {"team": "vision", "project": "llm"},
        "state": "stalled",
        "reason": "Idle",
        "gpu_faults": [],
        "blocked": None,
        "state_since": NOW - 600_000,
        "state_for_s": 600.0,
        "node": "gpu-node-17",
        "gpus": [GPU_0],
        "share": 0.02,
        "vram_bytes": 57 * GIB,
        "cost_usd": 1.1,
        "waste_usd": 0.4,
        "cost_per_unit": {},
    }
    assert doc["pods"][1]["labels"] == {}
    assert doc["pods"][1]["team"] is None
    gpu_1 = doc["gpus"][1]
    assert gpu_1["owners"] == [
        {"uid": "bbbbbbbb-2", "name": "research/notebook-ana-0"},
        {"uid": "zzzzzzzz-unknown", "name": None},
    ]
    assert (gpu_1["idle_for_s"], doc["gpus"][2]["idle_for_s"]) == (None, 720.0)
    assert [a["firing_for_s"] for a in doc["alerts"]] == [1800.0, 600.0, 60.0]
    assert doc["alerts"][0]["subject"] == {
        "kind": "gpu",
        "uid": None,
        "uuid": GPU_0,
        "node": "gpu-node-17",
        "name": "gpu GPU-8f3c2a1e@gpu-node-17",
    }
    assert doc["notes"] == []


def fitted(view: RenderableType, columns: int, rows: int) -> list[str]:
    """What the live view draws of `view` on a terminal of that size, without its styles."""
    return plain_lines(fit_screen(Console(file=io.StringIO()), view, columns, rows))


def test_fit_screen_cuts_width_and_height() -> None:
    view = Group(*(Text(f"line {i} " + "x" * 20) for i in range(10)))
    assert fitted(view, 12, 6) == [
        "line 0 xxxxx",
        "line 1 xxxxx",
        "line 2 xxxxx",
        "line 3 xxxxx",
        "... 6 more l",
    ]
    assert fitted(Group(Text("a"), Text("b")), 80, 24) == ["a", "b"]


def test_a_frame_of_a_screen_of_rows_draws_what_the_whole_frame_shows_there() -> None:
    cut = frame(SNAPSHOT, Query(), HEADER, NOW, rows_at_most=3)
    assert cut.hidden == 1  # the fourth pod; three GPUs and three alerts fit
    on_screen = plain_lines(fit_screen(Console(file=io.StringIO()), cut, 200, 9, cut.hidden))
    whole = fitted(frame(SNAPSHOT, Query(), HEADER, NOW), 200, 9)
    assert [line.split() for line in on_screen] == [line.split() for line in whole]
    assert whole[-1] == f"... {len(EXPECTED.splitlines()) - 7} more lines: use --limit"


def test_a_narrow_terminal_cuts_the_lines_of_the_plain_tables_at_its_edge() -> None:
    shown = fitted(frame(SNAPSHOT, Query(), HEADER, NOW), 50, 60)
    assert shown == [line[:50].rstrip() for line in EXPECTED.splitlines()]
    assert shown[4] == "POD                      TEAM    STATE     REASON"


XID = AlertRow(
    fingerprint="fp-xid",
    name="GpuXidError",
    severity="critical",
    since=NOW - 60_000,
    summary="Xid 79 (GPU has fallen off the bus) on GPU-2b9e7c44 ...; held by pod ...",
    subject_kind="gpu",
    subject_uuid=GPU_1,
    subject_node="gpu-node-17",
    labels={"gpu": GPU_1, "xid": "79", "namespace": "research", "pod": "notebook-ana-0",
            "pod_uid": NOTEBOOK.uid},
    value=79.0,
)  # fmt: skip
HOT = AlertRow(
    fingerprint="fp-hot",
    name="GpuThrottled",
    severity="warning",
    since=NOW - 120_000,
    summary="... throttled (hw_thermal_slowdown) for 60 s; held by pods ...",
    subject_kind="gpu",
    subject_uuid=GPU_0,
    subject_node="gpu-node-17",
    labels={"gpu": GPU_0, "reasons": "hw_thermal_slowdown",
            "pods": "ml/train-0,research/notebook-ana-0",
            "pod_uids": f"{TRAIN.uid},{NOTEBOOK.uid}"},
)  # fmt: skip


def test_a_pod_whose_gpu_faulted_shows_the_fault_beside_its_reason() -> None:
    snapshot = Snapshot(pods=PODS, gpus=GPUS, alerts=(XID, HOT))
    text = render_text(snapshot, Query(), Header("redis://x", "gpuwatch:"), NOW)
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith(("ml/", "res"))}
    assert "Idle; GPU: throttled" in rows["ml/train-0"]
    assert "GPU: Xid 79, throttled" in rows["research/notebook-ana-0"]
    assert "GPU:" not in rows["ml/eval-3"]
    doc = json.loads(render_json(snapshot, Query(), Header("redis://x", "gpuwatch:"), NOW))
    faults = {p["pod"]: p["gpu_faults"] for p in doc["pods"]}
    assert faults == {
        "train-0": ["throttled"], "notebook-ana-0": ["Xid 79", "throttled"],
        "eval-3": [], "old-1": [],
    }  # fmt: skip


def test_a_gpu_fault_follows_the_pods_it_names_through_a_filter() -> None:
    snapshot = Snapshot(pods=PODS, gpus=GPUS, alerts=(XID, HOT))
    view = select(snapshot, Query(namespace="research"))
    assert [a.fingerprint for a in view.alerts] == ["fp-xid", "fp-hot"]
    view = select(snapshot, Query(state="queued"))
    assert view.alerts == ()


def test_cost_per_unit_is_a_column_only_when_a_pod_reports_units() -> None:
    assert "$/UNIT" not in render_text(Snapshot(pods=PODS, gpus=GPUS), Query(), HEADER, NOW)
    training = replace(TRAIN, cost_per_unit={"steps": 0.000111111})
    serving = replace(NOTEBOOK, cost_per_unit={"tokens": 0.000000740741, "requests": None})
    text = render_text(Snapshot(pods=(training, serving, EVAL), gpus=GPUS), Query(), HEADER, NOW)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("POD "))
    assert header.split()[-1] == "$/UNIT"
    assert next(line for line in lines if "ml/train-0" in line).endswith("$0.000111/steps")
    row = next(line for line in lines if "notebook-ana-0" in line)
    assert row.endswith("-/requests $0.000741/1k tokens")
    assert next(line for line in lines if "ml/eval-3" in line).endswith(" -")


def test_json_is_byte_for_byte_what_scripts_read() -> None:
    expected = (Path(__file__).parent / "expected_top.json").read_text(encoding="utf-8")
    assert render_json(SNAPSHOT, Query(), HEADER, NOW) == expected
