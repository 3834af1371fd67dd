"""`gpuwatch top --once` against the local Redis, fed through the real RedisSink.

Each test writes under a key prefix of its own and deletes it afterwards. Times are whole
hours and minutes before the write, so a subprocess started a few seconds later still
shows the same `FOR` cells; the in-process runs pin `now` and check exact numbers.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from gpuwatch import cli
from gpuwatch.harness.examples import GPU_0, GPU_1, POD_UID, POD_UID_2, POD_UID_3, example
from gpuwatch.top import live as top
from gpuwatch.top.view import Query
from schemas.alert import Alert
from schemas.attribution import Attribution
from schemas.capacity import Capacity
from schemas.k8s_workload import K8sWorkload
from schemas.pod_lifecycle import PodLifecycle
from schemas.settings import RedisSettings, Settings
from sinks.redis.plan import GpuLive, SinkRecord
from sinks.redis.sink import RedisSink

pytestmark = pytest.mark.integration

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
T = TypeVar("T")
MIN, HOUR, GIB = 60_000, 3_600_000, 1 << 30
GPU_2 = "GPU-5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f"
POD_OLD = "d7e8f9a0-b1c2-4d3e-8f4a-5b6c7d8e9f01"
ORPHAN = "ffffffff-0000-4000-8000-000000000000"  # on a GPU, never written as a pod
H100 = "NVIDIA H100 80GB HBM3"


def _record(schema: str, cls: type[T], **changes: Any) -> T:
    return msgspec.convert({**example(schema), **changes}, cls)


def move(
    uid: str, ts: int, to: str, frm: str | None, reason: str | None, **kw: Any
) -> PodLifecycle:
    fields = {"uid": uid, "ts": ts, "to_state": to, "from_state": frm, "reason": reason, **kw}
    return _record("gpuwatch.pod.lifecycle/v1", PodLifecycle, **fields)


def window(
    uid: str, ws: int, *, cost: float, waste: float, gpu: str, used: float, vram: int, **kw: Any
) -> Attribution:
    gpus = [
        {
            "uuid": gpu,
            "model": H100,
            "sharing": "exclusive",
            "allocated_gpu_seconds": 60.0,
            "used_gpu_seconds": used,
            "idle_gpu_seconds": 0.0,
            "vram_peak_bytes": vram,
            "cost_usd": cost,
            "method": "exclusive",
        }
    ]
    fields = {"uid": uid, "window_start": ws, "window_end": ws + MIN, "ts": ws + MIN, "gpus": gpus}
    fields |= {"allocated_gpu_seconds": 60.0, "used_gpu_seconds": used, "vram_peak_bytes": vram}
    fields |= {"cost_usd": cost, "waste_usd": waste, **kw}
    return _record("gpuwatch.attribution/v1", Attribution, **fields)


def live(gpu: str, ts: int, used: int, pods: list[str], **kw: Any) -> GpuLive:
    fields = {"uuid": gpu, "node": "gpu-node-17", "model": H100, "sharing": "exclusive"}
    fields |= {"parent_uuid": None, "ts": ts, "mem_total_bytes": 85_520_809_984}
    fields |= {"mem_used_bytes": used, "pods": pods, "util_pct": None, "idle_since": None, **kw}
    return msgspec.convert(fields, GpuLive)


def alert(fp: str, name: str, status: str, *, ts: int, since: int, **kw: Any) -> Alert:
    fields = {"fingerprint": fp, "name": name, "status": status, "ts": ts, "since": since}
    return _record("gpuwatch.alert/v1", Alert, **fields, **kw)


def on_pod(uid: str, node: str | None = None) -> dict[str, Any]:
    return {"kind": "pod", "uid": uid, "uuid": None, "node": node}


ML = {"namespace": "ml"}
NOTEBOOK = {"namespace": "research", "pod": "notebook-ana-0", "labels": {"team": "nlp"}}
EVAL = {"namespace": "ml", "pod": "eval-3", "labels": {"team": "vision"}, "node": None}
OLD = {"namespace": "ml", "pod": "old-1", "labels": {}, "node": "gpu-node-02"}
L40S = {"node": "gpu-node-02", "model": "NVIDIA L40S", "mem_total_bytes": 48 * GIB}
STALL_SUMMARY = "ml/train-0 idle on every GPU for 5m"
IDLE_SUMMARY = "GPU GPU-8f3c2a1e on gpu-node-17 allocated and idle"


def cluster(t: int) -> list[SinkRecord]:
    """Four pods (stalled, running, queued, finished), three GPUs, two firing alerts."""
    stall_at, idle_at, queue_at = t - 130 * MIN, t - 140 * MIN, t - 65 * MIN
    gpu_0 = {"kind": "gpu", "uid": None, "uuid": GPU_0, "node": "gpu-node-17"}
    return [
        move(POD_UID, t - 5 * HOUR, "queued", None, "ImagePull", **ML),
        move(POD_UID, t - 290 * MIN, "running", "queued", None, **ML),
        move(POD_UID, stall_at, "stalled", "running", "Idle", **ML),
        window(POD_UID, t - 3 * MIN, cost=0.5, waste=0.1, gpu=GPU_0, used=30.0, vram=GIB, **ML),
        window(POD_UID, t - 2 * MIN, cost=0.6, waste=0.3, gpu=GPU_0, used=1.2, vram=57 * GIB, **ML),
        move(POD_UID_2, t - 4 * HOUR, "queued", None, None, **NOTEBOOK),
        move(POD_UID_2, t - 200 * MIN, "running", "queued", None, **NOTEBOOK),
        window(
            POD_UID_2,
            t - 2 * MIN,
            cost=2.0,
            waste=0.05,
            gpu=GPU_1,
            used=54.0,
            vram=20 * GIB,
            **NOTEBOOK,
        ),
        move(POD_UID_3, queue_at, "queued", None, "Unschedulable", **EVAL),
        move(POD_OLD, t - 9 * HOUR, "queued", None, None, **OLD),
        move(POD_OLD, t - 8 * HOUR, "running", "queued", None, **OLD),
        window(POD_OLD, t - 395 * MIN, cost=3.0, waste=0.2, gpu=GPU_2, used=30.0, vram=GIB, **OLD),
        move(POD_OLD, t - 390 * MIN, "finished", "running", "Completed", **OLD),
        live(GPU_0, t - 3000, 57 * GIB, [POD_UID], util_pct=1.0, idle_since=t - 145 * MIN),
        live(GPU_1, t - 1000, 20 * GIB, [POD_UID_2, ORPHAN], util_pct=85.0),
        live(GPU_2, t - 2000, 0, [], **L40S),
        alert(
            "fp-stall",
            "PodStalled",
            "firing",
            ts=stall_at,
            since=stall_at,
            subject=on_pod(POD_UID, "gpu-node-17"),
            severity="warning",
            summary=STALL_SUMMARY,
            labels={"namespace": "ml", "team": "vision"},
        ),
        alert(
            "fp-idle",
            "GpuIdleAllocated",
            "firing",
            ts=idle_at + 1,
            since=idle_at,
            subject=gpu_0,
            severity="critical",
            summary=IDLE_SUMMARY,
            labels=ML,
        ),
        *(
            alert(
                "fp-queue",
                "PodQueuedTooLong",
                status,
                ts=t - minutes * MIN,
                since=queue_at,
                subject=on_pod(POD_UID_3),
            )
            for status, minutes in (("firing", 55), ("resolved", 50))  # fired, then resolved
        ),
    ]


@pytest.fixture
def written(stack: Settings, prefix: str) -> int:
    """Writes the cluster under `prefix` through the sink; returns its `now` in epoch ms."""
    t = int(time.time() * 1000)
    with RedisSink(stack.redis, key_prefix=prefix) as sink:
        sink.apply(cluster(t))
    return t


def gpuwatch(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUWATCH_REDIS_URL": url}
    return subprocess.run(
        [str(GPUWATCH), *args], capture_output=True, text=True, timeout=60, env=env, check=False
    )


def section(text: str, title: str) -> list[str]:
    """The rows of one table, header first, cells joined by `|` (columns are 2+ spaces apart)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{title} ("))
    rows = []
    for line in lines[start + 1 :]:
        if not line or line.startswith("("):
            break
        rows.append("|".join(re.split(r" {2,}", line)))
    return rows


def first_cells(text: str, title: str) -> list[str]:
    return [row.split("|")[0] for row in section(text, title)[1:]]


def test_once_as_a_user_runs_it(stack: Settings, prefix: str, written: int) -> None:
    url = stack.redis.url.get_secret_value()
    result = gpuwatch("top", "--once", "--key-prefix", prefix, url=url)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out
    assert out.splitlines()[1] == (
        "pods: stalled 1  queued 1  running 1  finished 1  |  gpus 3  |  alerts firing 2  |  "
        "sort waste"
    )
    # The records are the examples': 600 steps a window, so a step costs the pod's cost
    # over 600 a window (train-0: $1.10 over 2 windows, $0.000917).
    assert section(out, "PODS") == [
        "POD|TEAM|STATE|REASON|FOR|SHARE|VRAM|COST $|WASTE $|GPUS|$/UNIT",
        "ml/train-0|vision|stalled|Idle|2h10m|2%|57.0Gi|1.10|0.4000|1 GPU-8f3c2a1e|$0.000917/steps",
        "ml/old-1|-|finished|Completed|6h30m|50%|1.0Gi|3.00|0.2000|1 GPU-5c6d7e8f|$0.005/steps",
        "research/notebook-ana-0|nlp|running|-|3h20m|90%|20.0Gi|2.00|0.0500|1 GPU-2b9e7c44|"
        "$0.00333/steps",
        "ml/eval-3|vision|queued|Unschedulable|1h05m|-|-|0.0000|0.0000|0|-",
    ]
    gpus = section(out, "GPUS")
    assert gpus[0] == "GPU|NODE|MODEL|UTIL|VRAM USED/TOTAL|IDLE FOR|SEEN|OWNERS"
    assert [re.sub(r"\|\d+s ago\|", "|SEEN|", row) for row in gpus[1:]] == [
        "GPU-5c6d7e8f|gpu-node-02|NVIDIA L40S|-|0/48.0Gi|-|SEEN|-",
        f"GPU-2b9e7c44|gpu-node-17|{H100}|85%|20.0Gi/79.6Gi|-|SEEN|research/notebook-ana-0,ffffffff",
        f"GPU-8f3c2a1e|gpu-node-17|{H100}|1%|57.0Gi/79.6Gi|2h25m|SEEN|ml/train-0",
    ]
    assert section(out, "ALERTS FIRING") == [
        "ALERT|SEVERITY|SUBJECT|FOR|SUMMARY",
        f"GpuIdleAllocated|critical|gpu GPU-8f3c2a1e@gpu-node-17|2h20m|{IDLE_SUMMARY}",
        f"PodStalled|warning|pod ml/train-0|2h10m|{STALL_SUMMARY}",
    ]
    assert "note:" not in out


def test_json_in_process_with_exact_numbers(stack: Settings, prefix: str, written: int) -> None:
    out = io.StringIO()
    options = top.TopOptions(query=Query(sort="cost"), key_prefix=prefix, json=True)
    assert top.run(stack.redis, options, out, now=lambda: (written + 1500) / 1000) == 0
    doc = json.loads(out.getvalue())
    assert doc["at"] == written + 1500
    assert [p["uid"] for p in doc["pods"]] == [POD_OLD, POD_UID_2, POD_UID, POD_UID_3]
    by_uid = {p["uid"]: p for p in doc["pods"]}
    train = by_uid[POD_UID]
    assert (train["state"], train["reason"], train["state_since"]) == (
        "stalled",
        "Idle",
        written - 130 * MIN,
    )
    assert train["state_for_s"] == 130 * 60 + 1.5
    assert (train["cost_usd"], train["waste_usd"], train["share"]) == (1.1, 0.4, 0.02)
    assert (train["vram_bytes"], train["gpus"], train["team"]) == (57 * GIB, [GPU_0], "vision")
    assert by_uid[POD_UID_3]["node"] is None
    assert by_uid[POD_OLD]["labels"] == {}
    assert [g["uuid"] for g in doc["gpus"]] == [GPU_2, GPU_1, GPU_0]
    assert doc["gpus"][1]["owners"] == [
        {"uid": POD_UID_2, "name": "research/notebook-ana-0"},
        {"uid": ORPHAN, "name": None},
    ]
    assert doc["gpus"][2]["idle_for_s"] == 145 * 60 + 1.5
    assert doc["gpus"][2]["updated_at"] == written - 3000
    assert [(a["fingerprint"], a["firing_for_s"]) for a in doc["alerts"]] == [
        ("fp-idle", 140 * 60 + 1.5),
        ("fp-stall", 130 * 60 + 1.5),
    ]
    assert doc["counts"]["states"] == {"stalled": 1, "queued": 1, "running": 1, "finished": 1}
    assert doc["notes"] == []


def test_filters_and_sort_through_the_cli_in_process(
    stack: Settings, prefix: str, written: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = stack.redis.url.get_secret_value()
    base = ["--redis-url", url, "top", "--once", "--key-prefix", prefix]
    assert cli.main([*base, "--sort", "vram", "--namespace", "ml"]) == 0
    out = capsys.readouterr().out
    assert first_cells(out, "PODS") == ["ml/train-0", "ml/old-1", "ml/eval-3"]
    assert first_cells(out, "GPUS") == ["GPU-8f3c2a1e"]  # the one GPU an ml pod owns
    assert first_cells(out, "ALERTS FIRING") == ["GpuIdleAllocated", "PodStalled"]

    assert cli.main([*base, "--team", "nlp", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["pod"] for p in doc["pods"]] == ["notebook-ana-0"]
    assert [g["uuid"] for g in doc["gpus"]] == [GPU_1]
    assert doc["alerts"] == []


def test_the_read_cap_leaves_rows_out_and_says_so(
    stack: Settings, prefix: str, written: int
) -> None:
    out = io.StringIO()
    options = top.TopOptions(key_prefix=prefix, max_rows=1, once=True)
    assert top.run(stack.redis, options, out, now=lambda: written / 1000) == 0
    text = out.getvalue()
    assert first_cells(text, "PODS") == ["ml/train-0"]  # stalled first
    gpus = [row.split("|") for row in section(text, "GPUS")[1:]]
    assert [(row[0], row[-1]) for row in gpus] == [  # the newest sample; owner named by lookup
        ("GPU-2b9e7c44", "research/notebook-ana-0,ffffffff")
    ]
    assert text.rstrip().splitlines()[-2:] == [
        "note: 3 pods left out: read at most 1 per refresh (--max-rows)",
        "note: 2 GPUs left out: read at most 1 per refresh (--max-rows)",
    ]
    out = io.StringIO()
    state = top.TopOptions(query=Query(state="finished"), key_prefix=prefix, max_rows=1, once=True)
    assert top.run(stack.redis, state, out, now=lambda: written / 1000) == 0
    assert first_cells(out.getvalue(), "PODS") == ["ml/old-1"]
    assert "pods left out" not in out.getvalue()  # only the finished set was read


def test_empty_redis_shows_empty_tables_and_a_hint(stack: Settings, prefix: str) -> None:
    result = gpuwatch(
        "top", "--once", "--key-prefix", prefix, url=stack.redis.url.get_secret_value()
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line for line in lines if line.endswith("(0)")] == [
        "PODS (0)",
        "GPUS (0)",
        "ALERTS FIRING (0)",
    ]
    assert lines.count("(none)") == 3
    assert lines[-1].startswith(f"note: nothing written under '{prefix}' in redis://")
    assert lines[-1].endswith("is the worker running (`gpuwatch worker`)?")


def fragmented(t: int) -> list[SinkRecord]:
    """The H100s' capacity with eval-3 blocked by fragmentation (an older picture arriving
    late), and L40S capacity of cluster-less records."""
    h100 = {"ts": t - MIN, "model": H100, "free": 6, "stranded": 6, "reclaimable": 1}
    h100 |= {"free_by_node": {"gpu-node-17": 2, "gpu-node-18": 2, "gpu-node-19": 2}}
    labels = {"namespace": "ml", "pod": "eval-3", "resource": "nvidia.com/gpu",
              "models": "any", "wanted": "4", "best_node": "gpu-node-17", "best_free": "2",
              "fleet_free": "6"}  # fmt: skip
    return [
        _record("gpuwatch.capacity/v1", Capacity, **h100),
        _record("gpuwatch.capacity/v1", Capacity, **h100 | {"ts": t - HOUR, "free": 9}),
        _record(
            "gpuwatch.capacity/v1",
            Capacity,
            ts=t - MIN,
            model="NVIDIA L40S",
            product="NVIDIA-L40S",
            free=0,
            stranded=0,
            reclaimable=0,
            free_by_node={},
            reclaimable_gpus=[],
            queued=0,
            blocked=0,
        ),
        alert(
            "fp-frag",
            "PodBlockedByFragmentation",
            "firing",
            ts=t - 50 * MIN,
            since=t - 50 * MIN,
            subject=on_pod(POD_UID_3),
            severity="warning",
            labels=labels,
            value=4.0,
            summary="ml/eval-3 wants 4 nvidia.com/gpu: best node gpu-node-17 has 2 "
            "free, 6 free over the nodes it could use",
        ),
    ]


def test_capacity_and_a_blocked_pod_as_a_user_sees_them(stack: Settings, prefix: str) -> None:
    t = int(time.time() * 1000)
    with RedisSink(stack.redis, key_prefix=prefix) as sink:
        sink.apply([*cluster(t), *fragmented(t)])
    url = stack.redis.url.get_secret_value()
    result = gpuwatch("top", "--once", "--key-prefix", prefix, url=url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[2] == f"capacity: {H100} free 6 (stranded 6) · reclaimable 1 · blocked 1"
    assert section(result.stdout, "PODS")[4] == (
        "ml/eval-3|vision|queued|Unschedulable; blocked: wants 4, best node 2, 6 free|1h05m|"
        "-|-|0.0000|0.0000|0|-"
    )
    result = gpuwatch("top", "--json", "--key-prefix", prefix, url=url)
    doc = json.loads(result.stdout)
    assert [(c["model"], c["free"], c["ts"]) for c in doc["capacity"]] == [
        (H100, 6, t - MIN), ("NVIDIA L40S", 0, t - MIN)
    ]  # fmt: skip
    (blocked,) = [p["blocked"] for p in doc["pods"] if p["blocked"]]
    assert (blocked["wanted"], blocked["best_node"], blocked["fleet_free"]) == (
        4, "gpu-node-17", 6
    )  # fmt: skip


def _refused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: nothing listens there


def test_unreachable_redis_is_one_line_and_exit_2() -> None:
    port = _refused_port()
    result = gpuwatch("top", "--once", url=f"redis://:s3cret@127.0.0.1:{port}/0")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith(
        f"gpuwatch: cannot read Redis at redis://:***@127.0.0.1:{port}/0: "
    )
    assert "s3cret" not in result.stderr
    assert "Connection refused" in result.stderr


def test_unreachable_redis_in_process_raises_with_the_redacted_url() -> None:
    url = f"redis://user:pw@127.0.0.1:{_refused_port()}/3"
    with pytest.raises(top.TopUnavailable, match=r"redis://user:\*\*\*@127\.0\.0\.1:\d+/3"):
        top.run(RedisSettings(url=url), top.TopOptions(once=True), io.StringIO())


def test_jobs_waiting_in_kueue_have_a_section_of_their_own(stack: Settings, prefix: str) -> None:
    """A job Kueue holds has no pods: top shows its workload, longest waiting first, with
    Kueue's reason; admitted, finished and deleted workloads are not listed."""
    t = int(time.time() * 1000)
    message = (
        "couldn't assign flavors to pod set main: insufficient unused quota for "
        "nvidia.com/gpu in flavor h100, 24 more needed"
    )
    pending = [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                "message": message, "at": t - 20 * MIN}]  # fmt: skip
    admitted = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "",
         "at": t - MIN},
        {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "", "at": t - MIN},
    ]  # fmt: skip

    def kueue(uid: str, name: str, created: int, conditions: list[Any], **kw: Any) -> K8sWorkload:
        return _record("gpuwatch.k8s.workload/v1", K8sWorkload, uid=uid, name=name, ts=t - MIN,
                       created_at=created, conditions=conditions, **kw)  # fmt: skip

    with RedisSink(stack.redis, key_prefix=prefix) as sink:
        sink.apply([
            kueue("w-new", "job-eval-11aa2", t - 5 * MIN, [], pods=1,
                  gpu_request={"nvidia.com/gpu": 2}, labels={"team": "nlp"}),
            kueue("w-old", "job-pretrain-3f2a1", t - 20 * MIN, pending),
            kueue("w-in", "job-admitted-0c1d2", t - 30 * MIN, admitted),
        ])  # fmt: skip
    url = stack.redis.url.get_secret_value()
    result = gpuwatch("top", "--once", "--key-prefix", prefix, url=url)
    assert result.returncode == 0, result.stderr
    assert section(result.stdout, "QUEUED IN KUEUE") == [
        "WORKLOAD|QUEUE|TEAM|PODS|GPUS|REASON|FOR|OWNER",
        "research/job-pretrain-3f2a1|research|vision|4|32|WaitingForQuota|20m00s|Job/llm-pretrain",
        "research/job-eval-11aa2|research|nlp|1|2|Pending|5m00s|Job/llm-pretrain",
    ]
    out = io.StringIO()
    options = top.TopOptions(query=Query(team="nlp"), key_prefix=prefix, json=True)
    assert top.run(stack.redis, options, out, now=lambda: t / 1000) == 0
    (only,) = json.loads(out.getvalue())["kueue_queued"]
    assert (only["name"], only["reason"], only["for_s"], only["gpus"]) == (
        "job-eval-11aa2", "Pending", 300.0, 2
    )  # fmt: skip
