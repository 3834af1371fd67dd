"""`gpuwatch top` without Redis: hashes to rows, the read cap, the redraw loop, the verb's flags."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from os import terminal_size

import pytest
from rich.console import Group
from rich.text import Text

from gpuwatch import cli
from gpuwatch.top.live import (
    TopOptions,
    TopUnavailable,
    live,
    parse_alert,
    parse_gpu,
    parse_pod,
    pick_uids,
)
from gpuwatch.top.view import PodRow, Query, Snapshot

GPU_0 = "GPU-8f3c2a1e-5b7d-4c9a-8e6f-1d2b3c4a5e6f"


def test_pod_hash_as_the_sink_writes_it() -> None:
    fields = {
        "namespace": "ml",
        "pod": "train-0",
        "node": "gpu-node-17",
        "labels": '{"project":"llm-pretrain","team":"vision"}',
        "state": "stalled",
        "state_since": "1764412645000",
        "reason": "Idle",
        "gpus": json.dumps(
            [{"uuid": GPU_0, "model": "H100", "sharing": "exclusive", "method": "exclusive"}]
        ),
        "vram_bytes": "61203283968",
        "share": "0.86",
        "cost_usd": "0.197400000",
        "waste_usd": "0.009900000",
        "window_start": "1764412320000",
        "updated_at": "1764412645000",
    }
    assert parse_pod("uid-1", fields) == PodRow(
        uid="uid-1",
        namespace="ml",
        pod="train-0",
        state="stalled",
        state_since=1_764_412_645_000,
        reason="Idle",
        node="gpu-node-17",
        labels={"project": "llm-pretrain", "team": "vision"},
        gpus=(GPU_0,),
        share=0.86,
        vram_bytes=61_203_283_968,
        cost_usd=0.1974,
        waste_usd=0.0099,
    )


def test_a_queued_pod_has_nulls_and_a_gone_hash_is_no_row() -> None:
    queued = {"namespace": "ml", "pod": "eval-3", "node": "", "labels": "{}"}
    queued |= {"state": "queued", "state_since": "1000", "reason": "Unschedulable"}
    row = parse_pod("uid-3", queued)
    assert row is not None
    assert (row.gpus, row.share, row.vram_bytes, row.cost_usd, row.node) == ((), None, None, 0, "")
    assert parse_pod("uid-gone", {}) is None
    garbage = parse_pod("uid-4", {"state": "running", "share": "n/a", "gpus": "[", "labels": "7"})
    assert garbage is not None
    assert (garbage.share, garbage.gpus, garbage.labels) == (None, (), {})


def test_gpu_hash_with_and_without_readings() -> None:
    fields = {"node": "n1", "model": "H100", "util_pct": "2.5", "mem_used_bytes": "7"}
    fields |= {"mem_total_bytes": "80", "pods": '["p1","p2"]', "idle_since": "300000"}
    fields |= {"updated_at": "420000", "sharing": "exclusive", "parent_uuid": ""}
    row = parse_gpu(GPU_0, fields)
    assert (row.util_pct, row.mem_used_bytes, row.mem_total_bytes) == (2.5, 7, 80)
    assert (row.owners, row.idle_since, row.updated_at) == (("p1", "p2"), 300_000, 420_000)
    bare = parse_gpu(GPU_0, {"util_pct": "", "idle_since": "", "pods": "[]"})
    assert (bare.util_pct, bare.idle_since, bare.owners, bare.updated_at) == (None, None, (), None)


def test_firing_alert_json() -> None:
    raw = json.dumps(
        {
            "schema": "gpuwatch.alert/v1",
            "fingerprint": "fp",
            "name": "PodStalled",
            "status": "firing",
            "severity": "warning",
            "ts": 2000,
            "since": 1500,
            "subject": {"kind": "pod", "uid": "u1", "uuid": None, "node": "n1"},
            "labels": {"namespace": "ml"},
            "summary": "stalled",
            "value": 300,
        }
    )
    row = parse_alert("fp", raw)
    assert row is not None
    assert (row.name, row.since, row.subject_kind, row.subject_uid, row.subject_uuid) == (
        "PodStalled",
        1500,
        "pod",
        "u1",
        None,
    )
    assert (row.labels, row.value) == ({"namespace": "ml"}, 300.0)
    assert parse_alert("fp", "not json") is None


def test_pick_uids_fills_the_cap_in_order_without_repeats() -> None:
    lists = {"stalled": ["s1"], "queued": ["q1", "q2"], "running": ["s1", "r1", "r2"]}
    order = ("stalled", "queued", "running", "finished")
    assert pick_uids(lists, order, 10) == [
        ("stalled", "s1"),
        ("queued", "q1"),
        ("queued", "q2"),
        ("running", "r1"),
        ("running", "r2"),
    ]
    assert pick_uids(lists, order, 3) == [("stalled", "s1"), ("queued", "q1"), ("queued", "q2")]
    assert pick_uids(lists, ("running",), 2) == [("running", "s1"), ("running", "r1")]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def stop_after(n: int, slept: list[float]) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == n:
            raise KeyboardInterrupt

    return sleep


def render(snapshot: Snapshot, at: int) -> Text:
    return Text(f"at {at} pods {len(snapshot.pods)}")


def pods(n: int) -> Snapshot:
    return Snapshot(
        pods=tuple(PodRow(uid=str(i), namespace="ns", pod="p", state="running") for i in range(n))
    )


def test_live_redraws_until_ctrl_c_and_keeps_rows_when_a_read_fails() -> None:
    reads: list[Snapshot | Exception] = [TopUnavailable("cannot read Redis at redis://x"), pods(2)]

    def read() -> Snapshot:
        item = reads.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    clock = iter([1.0, 3.0, 5.0])
    slept: list[float] = []
    out = io.StringIO()
    status = live(
        read,
        render,
        pods(1),
        out,
        interval_s=2.0,
        now=lambda: next(clock),
        sleep=stop_after(3, slept),
    )
    assert status == 0
    assert slept == [2.0, 2.0, 2.0]
    assert out.getvalue() == (
        "at 1000 pods 1\n\n"
        "! cannot read Redis at redis://x (retrying every 2s)\nat 3000 pods 1\n\n"
        "at 5000 pods 2\n\n"
    )
    assert "\x1b" not in out.getvalue()


ALT_SCREEN_ON, ALT_SCREEN_OFF, HOME = "\x1b[?1049h", "\x1b[?1049l", "\x1b[H"
SHOW_CURSOR = "\x1b[?25h"


def test_live_on_a_terminal_draws_full_screen_frames_fitted_and_leaves_the_last() -> None:
    out = Tty()
    reads = iter([pods(2), pods(3)])
    status = live(
        lambda: next(reads),
        lambda s, at: Group(*(Text(f"row {i} {len(s.pods)}{'x' * 30}") for i in range(10))),
        pods(1),
        out,
        interval_s=0.5,
        now=lambda: 0.0,
        sleep=stop_after(3, []),
        screen=lambda: terminal_size((10, 5)),
    )
    assert status == 0
    screen, after = out.getvalue().split(SHOW_CURSOR + ALT_SCREEN_OFF)
    assert screen.startswith(ALT_SCREEN_ON)
    frames = [f for f in screen.split(HOME) if f.startswith("row")]
    assert [f.splitlines() for f in frames] == [
        ["row 0 1xxx", "row 1 1xxx", "row 2 1xxx", "... 7 more", " " * 10],
        ["row 0 2xxx", "row 1 2xxx", "row 2 2xxx", "... 7 more", " " * 10],
        ["row 0 3xxx", "row 1 3xxx", "row 2 3xxx", "... 7 more", " " * 10],
    ]
    assert after.splitlines() == ["row 0 3xxx", "row 1 3xxx", "row 2 3xxx", "... 7 more"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_rows": 0}, "max_rows"),
        ({"interval_s": 0.0}, "interval"),
        ({"query": Query(limit=0)}, "limit"),
        ({"key_prefix": "bad prefix*"}, "key prefix"),
    ],
)
def test_options_refuse_what_cannot_work(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TopOptions(**changes)  # type: ignore[arg-type]


def test_top_flags_parse_into_the_query() -> None:
    filters = ["--namespace", "ml", "--team", "vision", "--state", "running"]
    others = [
        "--limit",
        "5",
        "--once",
        "--interval",
        "0.5",
        "--key-prefix",
        "t:",
        "--max-rows",
        "9",
    ]
    args = cli.build_parser().parse_args(["top", "--sort", "vram", *filters, *others])
    assert (args.sort, args.top_namespace, args.team, args.state, args.limit) == (
        "vram",
        "ml",
        "vision",
        "running",
        5,
    )
    assert (args.once, args.json, args.top_interval, args.key_prefix, args.max_rows) == (
        True,
        False,
        0.5,
        "t:",
        9,
    )
    defaults = cli.build_parser().parse_args(["top"])
    assert (defaults.sort, defaults.top_interval, defaults.key_prefix) == (
        "waste",
        2.0,
        "gpuwatch:",
    )


def test_bad_top_flags_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["top", "--sort", "speed"])
    assert exit_info.value.code == 2
    assert cli.main(["top", "--once", "--limit", "0"]) == 1
    assert "gpuwatch: top: limit must be at least 1" in capsys.readouterr().err
