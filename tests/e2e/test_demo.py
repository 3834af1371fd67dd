"""`gpuwatch demo` as a user runs it: the small scenario, ten minutes at twenty times speed.

Everything is real: the stack of the session, the node agents and the watcher driven by the
simulator (lz4-compressed batches, as deployed), the worker with its Redis writer and its
/metrics, and `gpuwatch top --once` at the end. The demo has its own topics, consumer groups,
Redis database and metrics port, so it touches nothing of other tests.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from support import free_port, run_command
from topic_io import consume_all

from gpuwatch import kafka
from schemas import ATTRIBUTION
from schemas.settings import Settings

pytestmark = pytest.mark.integration

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
DB = 8  # the demo's Redis database in this test


@pytest.fixture
def demo_scope(stack: Settings) -> Iterator[dict[str, str]]:
    """Environment of a demo run of its own; its topics, groups and Redis data go after."""
    tag = uuid.uuid4().hex[:8]
    env = {
        "GPUWATCH_TOPIC_PREFIX": f"gwdemo-{tag}.",
        "GPUWATCH_APP_ID": f"gwdemo-{tag}",
        "GPUWATCH_KAFKA_PARTITIONS": "3",
        "GPUWATCH_REDIS_URL": f"redis://127.0.0.1:{stack.stack.redis_port}/{DB}",
        "GPUWATCH_METRICS_PORT": str(free_port()),
        "GPUWATCH_AGENT_METRICS_PORT": str(free_port()),
        "GPUWATCH_WATCHER_METRICS_PORT": str(free_port()),
    }
    client = redis.Redis(port=stack.stack.redis_port, db=DB, decode_responses=True)
    client.flushdb()
    yield env
    client.flushdb()
    client.close()
    admin = kafka.admin(stack.kafka)
    try:
        names = [n for n in admin.list_topics() if n.startswith(env["GPUWATCH_TOPIC_PREFIX"])]
        if names:
            admin.delete_topics(names)
        known = {g["group_id"] for g in admin.list_groups()}
        if gone := [g for g in known if g.startswith(env["GPUWATCH_APP_ID"])]:
            admin.delete_groups(gone)
    finally:
        admin.close()


def test_ten_minutes_of_the_small_scenario_end_with_its_pods_and_alerts_in_redis(
    stack: Settings, demo_scope: dict[str, str]
) -> None:
    argv = [str(GPUWATCH), "demo", "--scenario", "small", "--speed", "20"]
    argv += ["--duration", "30", "--no-ui"]  # ten simulated minutes
    result = run_command(argv, timeout_s=240, env={**os.environ, **demo_scope})
    assert result.returncode == 0, result.stderr + result.stdout
    assert "Where to look" in result.stdout
    assert f"http://127.0.0.1:{stack.stack.prometheus_port}/alerts" in result.stdout

    client = redis.Redis(port=stack.stack.redis_port, db=DB, decode_responses=True)
    pods = {}
    for state in ("queued", "running", "stalled", "finished"):
        for uid in client.zrange(f"gpuwatch:state:{state}", 0, -1):
            fields = client.hgetall(f"gpuwatch:pod:{uid}")
            pods[f"{fields['namespace']}/{fields['pod']}"] = (state, fields.get("reason", ""))
    # The small scenario (gpuwatch/harness/simulate/scenarios/small.yaml) over its first ~550
    # simulated seconds: the notebook idles (stalled after the demo's 120 s), bert is
    # OOMKilled at 275 s, eval-sweep waits for two GPUs on one node until 605 s,
    # vision-train and the others run.
    assert pods["research/notebook-ana-0"] == ("stalled", "Idle")
    assert pods["research/bert-oom-0"] == ("finished", "OOMKilled")
    assert pods["research/eval-sweep-0"] == ("queued", "Unschedulable")
    for name in ("vision-train-0", "vision-train-1", "llm-finetune-0"):
        assert pods[f"research/{name}"] == ("running", ""), name
    assert pods["serving/chat-serving-0"] == ("running", "")

    alerts = [json.loads(raw) for raw in client.hgetall("gpuwatch:alerts:firing").values()]
    firing = {(a["name"], a["labels"].get("pod", a["subject"].get("uuid"))) for a in alerts}
    assert ("PodStalled", "notebook-ana-0") in firing, firing
    assert ("PodQueuedTooLong", "eval-sweep-0") in firing, firing
    assert {name for name, _ in firing} >= {"GpuIdleAllocated"}
    # Cost accrues: the long-running pods have lifetime totals from their windows.
    assert float(client.hget(f"gpuwatch:pod:{_uid(client, 'llm-finetune-0')}", "cost_usd")) > 0
    # Units of work: vision-train does 10 steps a second on a $4.00/h H100, so its full
    # windows cost $0.000111 a step; its first window is partial, so its life so far costs a
    # little more or less per step. chat-serving's tokens: $0.000741 a thousand.
    train = client.hgetall(f"gpuwatch:pod:{_uid(client, 'vision-train-0')}")
    per_step = json.loads(train["cost_per_unit"])["steps"]
    assert per_step == pytest.approx(4.0 / 36_000, rel=0.1), train
    serve = client.hgetall(f"gpuwatch:pod:{_uid(client, 'chat-serving-0')}")
    per_token = json.loads(serve["cost_per_unit"])["tokens"]
    assert per_token * 1000 == pytest.approx(4.0 / 5_400, rel=0.1), serve

    # The live view printed at the end shows the same.
    top = result.stdout.split("Ctrl-C stops the demo.", 1)[1]
    row = next(line for line in top.splitlines() if line.startswith("research/notebook-ana-0"))
    assert row.split()[2:4] == ["stalled", "Idle"], row
    assert "PodQueuedTooLong" in top
    header = next(line for line in top.splitlines() if line.startswith("POD "))
    assert header.split()[-1] == "$/UNIT", header
    row = next(line for line in top.splitlines() if line.startswith("research/vision-train-0"))
    assert row.endswith("/steps"), row
    row = next(line for line in top.splitlines() if line.startswith("serving/chat-serving-0"))
    assert "/1k tokens" in row, row

    # The chargeback report over the demo's topics: per hour and team, the groups and the
    # unallocated GPU time add up to each hour's total; the cost per step is the hand-worked
    # one where vision-train ran whole windows.
    report = _report(demo_scope, "--by", "team", "--step", "1h", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(report)))
    assert {r["kind"] for r in rows} >= {"group", "unallocated", "total"}, report
    # The simulated time can cross an hour: then a period total (starting at `--from`) follows
    # the steps' rows, and it adds up the steps' totals.
    steps = {r["step_start"] for r in rows if r["kind"] != "period_total"}
    for step in steps:
        of_step = [r for r in rows if r["step_start"] == step and r["kind"] != "period_total"]
        (total,) = [r for r in of_step if r["kind"] == "total"]
        parts = [r for r in of_step if r["kind"] in ("group", "unallocated")]
        assert sum(float(r["cost_usd"]) for r in parts) == pytest.approx(
            float(total["cost_usd"]), abs=1e-6
        ), of_step
    period = [r for r in rows if r["kind"] == "period_total"]
    assert len(period) == (1 if len(steps) > 1 else 0), report
    for row in period:
        totals = sum(float(r["cost_usd"]) for r in rows if r["kind"] == "total")
        assert float(row["cost_usd"]) == pytest.approx(totals, abs=1e-6), report
    assert any(r["group"] == "vision" and r["cost_per_unit_usd.steps"] for r in rows), report
    table = _report(demo_scope, "--by", "team", "--step", "1h")
    assert "(unallocated)" in table, table
    assert "COST USD" in table, table
    # The pods' allocated cost equals the GPU windows' (within 1 %) over the windows both
    # sides closed: the pod side closes a window once every node partition's time has
    # passed it, so the ones after the last window it closed are left out (`--to`).
    scoped = stack.model_copy(
        update={"kafka": stack.kafka.model_copy(update={"topic_prefix": _prefix(demo_scope)})}
    )
    topic = ATTRIBUTION.full_name(_prefix(demo_scope))
    closed = max(json.loads(r.value)["window_end"] for r in consume_all(scoped, topic))
    to = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(closed // 1000 - 60))
    report = _report(demo_scope, "--step", "1h", "--format", "json", to=to)
    totals = [r for r in json.loads(report) if r["kind"] == "total"]
    assert totals, report
    for row in totals:
        print("FIGURES report total", row["step_start"], row["allocated_cost_gap"])
        assert row["allocated_cost_gap"] is not None, row
        assert abs(row["allocated_cost_gap"]) <= 0.01, row


def _prefix(scope: dict[str, str]) -> str:
    return scope["GPUWATCH_TOPIC_PREFIX"]


def _report(scope: dict[str, str], *args: str, to: str | None = None) -> str:
    """`gpuwatch report` over the demo's topics, its simulated time (run ahead of the wall
    clock at its speed) inside the period (up to `to` where given); the output."""
    span = [
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
        for t in (time.time() - 6 * 3600, time.time() + 6 * 3600)
    ]
    if to is not None:
        span[1] = to
    argv = [str(GPUWATCH), "report", "--from", span[0], "--to", span[1], *args]
    done = run_command(argv, timeout_s=120, env={**os.environ, **scope})
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout


def _uid(client: redis.Redis, pod: str) -> str:
    for state in ("queued", "running", "stalled", "finished"):
        for uid in client.zrange(f"gpuwatch:state:{state}", 0, -1):
            if client.hget(f"gpuwatch:pod:{uid}", "pod") == pod:
                return str(uid)
    raise AssertionError(f"no pod {pod} in Redis")


def test_two_simulated_clusters_are_told_apart_and_filtered_in_top(
    stack: Settings, demo_scope: dict[str, str]
) -> None:
    """`demo --clusters`: the same scenario twice, the same node and pod names, one pipeline."""
    argv = [str(GPUWATCH), "demo", "--scenario", "small", "--speed", "20"]
    argv += ["--duration", "30", "--no-ui", "--clusters", "train,infer"]
    env = {**os.environ, **demo_scope}
    result = run_command(argv, timeout_s=300, env=env)
    assert result.returncode == 0, result.stderr + result.stdout

    client = redis.Redis(port=stack.stack.redis_port, db=DB, decode_responses=True)
    notebooks = {}
    for state in ("queued", "running", "stalled", "finished"):
        for uid in client.zrange(f"gpuwatch:state:{state}", 0, -1):
            fields = client.hgetall(f"gpuwatch:pod:{uid}")
            if fields.get("pod") == "notebook-ana-0":
                notebooks[fields["cluster"]] = (uid, state, fields.get("node"))
    assert sorted(notebooks) == ["infer", "train"], notebooks
    (uid_a, state_a, node_a), (uid_b, state_b, node_b) = notebooks.values()
    assert uid_a != uid_b
    assert node_a == node_b  # the same node name in both clusters
    assert state_a == state_b == "stalled"
    alerts = [json.loads(raw) for raw in client.hgetall("gpuwatch:alerts:firing").values()]
    stalled = {a["labels"].get("cluster") for a in alerts if a["name"] == "PodStalled"}
    assert stalled >= {"train", "infer"}, alerts

    top = result.stdout.split("Ctrl-C stops the demo.", 1)[1]
    assert "clusters: infer train" in top
    rows = [line.split() for line in top.splitlines() if "notebook-ana-0" in line]
    assert sorted(row[0] for row in rows if row[1] == "research/notebook-ana-0") == [
        "infer",
        "train",
    ]

    one = run_command(
        [str(GPUWATCH), "top", "--once", "--json", "--cluster", "infer"], timeout_s=60, env=env
    )
    assert one.returncode == 0, one.stderr
    doc = json.loads(one.stdout)
    assert doc["clusters"] == ["infer", "train"]
    assert doc["pods"]
    assert {p["cluster"] for p in doc["pods"]} == {"infer"}
    assert {g["cluster"] for g in doc["gpus"]} == {"infer"}


def test_the_incident_shows_its_gpu_faults_with_the_pods_they_hit(
    stack: Settings, demo_scope: dict[str, str]
) -> None:
    """The incident scenario (gpuwatch/harness/simulate/scenarios/README.md): an Xid 79 on a GPU of
    train-a at 150 s (firing until 451 s), a thermal slowdown of chat-serving's GPU from
    200 s (GpuThrottled 260 s to 380 s) and a 4-GPU job blocked by fragmentation from
    185 s; the demo stops about 350 s in. At 5 times speed: GpuThrottled fires 90
    simulated seconds before the end, 18 s of wall time for a worker running behind on a
    loaded machine to get there."""
    argv = [str(GPUWATCH), "demo", "--scenario", "incident", "--speed", "5"]
    argv += ["--duration", "70", "--no-ui"]
    result = run_command(argv, timeout_s=240, env={**os.environ, **demo_scope})
    assert result.returncode == 0, result.stderr + result.stdout

    client = redis.Redis(port=stack.stack.redis_port, db=DB, decode_responses=True)
    alerts = [json.loads(raw) for raw in client.hgetall("gpuwatch:alerts:firing").values()]
    health = {a["name"]: a for a in alerts if a["name"] in ("GpuXidError", "GpuThrottled")}
    assert set(health) == {"GpuXidError", "GpuThrottled"}, alerts
    xid, hot = health["GpuXidError"], health["GpuThrottled"]
    assert (xid["labels"]["xid"], xid["labels"]["pod"], xid["severity"]) == (
        "79",
        "train-a-0",
        "critical",
    )
    assert "GPU has fallen off the bus" in xid["summary"]
    # Each names its pod's workload owner (the watcher's: a Deployment over the ReplicaSet).
    assert (xid["labels"]["owner"], hot["labels"]["owner"]) == (
        "Job/train-a",
        "Deployment/chat-serving",
    )
    assert (hot["labels"]["pod"], hot["labels"]["reasons"]) == (
        "chat-serving-0",
        "hw_thermal_slowdown",
    )
    timeline = client.xrange(f"gpuwatch:timeline:{xid['labels']['pod_uid']}")
    assert any(entry.get("name") == "GpuXidError" for _, entry in timeline), timeline

    # big-train-0 asks for 4 GPUs at 60 s while one is free on each node (a shortage, no
    # alert); oom-job's GPU on h100-1 comes free with the sample of 185 s: 4 free, 2 on
    # h100-1 at most, so blocked by fragmentation from 185 s (t0: the notebook's idle run,
    # idle since the start). done-job completes at 245 s: 5 free (1, 2, 2), all stranded;
    # the idle GPUs of idle-job (2) and the notebook (1) are reclaimable.
    t0 = min(a["since"] for a in alerts if a["name"] == "GpuIdleAllocated")
    (blocked,) = [a for a in alerts if a["name"] == "PodBlockedByFragmentation"]
    assert blocked["since"] - t0 == 185_000
    labels = blocked["labels"]
    assert (labels["pod"], labels["wanted"], labels["best_node"]) == ("big-train-0", "4", "h100-1")
    assert (labels["best_free"], labels["fleet_free"], labels["owner"]) == (
        "2",
        "4",
        "Job/big-train",
    )
    (field, raw) = client.hgetall("gpuwatch:capacity").popitem()
    picture = json.loads(raw)
    assert field == "NVIDIA-H100-80GB-HBM3/nvidia.com/gpu"  # the nodes' gpu.product label
    assert picture["model"] == "NVIDIA H100 80GB HBM3"  # as NVML and the GPU series say
    assert picture["free_by_node"] == {"h100-0": 1, "h100-1": 2, "h100-2": 2}
    figures = [picture[k] for k in ("free", "stranded", "queued", "blocked")]
    assert figures == [5, 5, 1, 1], picture
    # idle-job's 2 GPUs and the notebook's are reclaimable from 60 s on; broken-trainer's
    # too while its idle alert fires in a long back-off (254-275 s, 364-465 s...), so
    # whether it is among them depends on the second the demo stopped at.
    holders = sorted(g["pods"][0] for g in picture["reclaimable_gpus"])
    steady = ["research/forgotten-notebook-0", "research/idle-job-0", "research/idle-job-0"]
    assert [h for h in holders if h != "nlp/broken-trainer-0"] == steady, picture
    assert picture["reclaimable"] == len(holders)

    top = result.stdout.split("Ctrl-C stops the demo.", 1)[1]
    rows = {line.split()[0]: line for line in top.splitlines() if "/" in line.split(" ", 1)[0]}
    assert "GPU: Xid 79" in rows["research/train-a-0"], top
    assert "GPU: throttled" in rows["serving/chat-serving-0"], top
    assert "free 5 (stranded 5)" in top, top
    assert "blocked 1" in top, top
    assert "blocked: wants 4, best node 2, 4 free" in rows["research/big-train-0"], top


def _kueue_queued(env: dict[str, str], deadline_s: float) -> list[dict[str, object]]:
    """`gpuwatch top --once --json`'s Kueue workloads, asked every second until there are."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        shown = run_command([str(GPUWATCH), "top", "--once", "--json"], timeout_s=30, env=env)
        if shown.returncode == 0 and (found := json.loads(shown.stdout)["kueue_queued"]):
            return list(found)
        time.sleep(1)
    raise AssertionError("no Kueue workload waiting in `gpuwatch top` within the deadline")


def test_a_kueue_queued_job_on_dra_gpus_as_worked_out_by_hand(
    stack: Settings, demo_scope: dict[str, str]
) -> None:
    """The dra scenario (gpuwatch/harness/simulate/scenarios/dra.yaml), 40 minutes at 60 times
    speed. Kueue's queue research has 4 GPUs: prep-dra's 4 pods take them at 0 s and
    complete at 1,200 s; train-dra waits as a Workload without pods, for quota, until
    then, is admitted, and its 4 pods complete at 1,805 s. The GPUs of dra-0 and dra-1
    come through ResourceClaims: the kubelet lists them by driver, pool and device name,
    the node agents find their uuids in the nodes' ResourceSlices. At $4.00 per H100-hour:
    each prep pod holds its GPU 1,200 s ($1.3333), each train pod 605 s ($0.6722).
    chat-dra's 2 pods share one claim's GPU: each pays half of it, together what
    chat-plugin-0 pays for its GPU of the device plugin over the same time."""
    argv = [str(GPUWATCH), "demo", "--scenario", "dra", "--speed", "60"]
    argv += ["--duration", "40", "--no-ui"]
    env = {**os.environ, **demo_scope}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        demo = subprocess.Popen(argv, stdout=out, stderr=err, text=True, env=env)
        try:
            # While train-dra waits (its first 20 simulated minutes, 20 s here), top shows
            # it in Kueue's queue: a job without pods.
            waiting = _kueue_queued(env, deadline_s=60)
        finally:
            demo.wait(timeout=240)
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(argv, demo.returncode, out.read(), err.read())
    assert result.returncode == 0, result.stderr + result.stdout
    train = next(w for w in waiting if w["name"].startswith("job-train-dra-"))
    # Its GPUs come through claims: the pod set's template's, one gpu.nvidia.com each.
    assert (train["queue"], train["reason"], train["pods"], train["gpus"]) == (
        "research", "WaitingForQuota", 4, 4
    )  # fmt: skip
    # prep-dra was admitted at once: not waiting (its creation and admission share a time).
    assert not [w for w in waiting if str(w["name"]).startswith("job-prep-dra-")], waiting
    assert "insufficient unused quota for gpu.nvidia.com/gpu" in train["message"]

    client = redis.Redis(port=stack.stack.redis_port, db=DB, decode_responses=True)
    pods = {}
    for state in ("queued", "running", "stalled", "finished"):
        for uid in client.zrange(f"gpuwatch:state:{state}", 0, -1):
            fields = client.hgetall(f"gpuwatch:pod:{uid}")
            pods[fields["pod"]] = fields
    for job, seconds in (("prep-dra", 1200), ("train-dra", 605)):
        for i in range(4):
            pod = pods[f"{job}-{i}"]
            assert (pod["state"], pod["reason"]) == ("finished", "Completed"), pod
            assert float(pod["cost_usd"]) == pytest.approx(seconds * 4.0 / 3600, abs=0.0025), pod
            (gpu,) = json.loads(pod["gpus"])
            assert (gpu["sharing"], gpu["model"]) == ("exclusive", "NVIDIA H100 80GB HBM3"), gpu
    trained_on = {json.loads(pods[f"train-dra-{i}"]["gpus"])[0]["uuid"] for i in range(4)}
    assert len(trained_on) == 4
    chat = [pods["chat-dra-0"], pods["chat-dra-1"]]
    (shared,) = {json.loads(p["gpus"])[0]["uuid"] for p in chat}
    assert all(json.loads(p["gpus"])[0]["sharing"] == "time-slicing" for p in chat)
    assert shared not in trained_on
    plugin = float(pods["chat-plugin-0"]["cost_usd"])
    assert plugin > 1.5  # 30 minutes and more at $4/h, as far as its windows closed
    halves = [float(p["cost_usd"]) for p in chat]
    assert halves[0] == pytest.approx(plugin / 2, rel=0.02)
    assert sum(halves) == pytest.approx(plugin, rel=0.02)

    alerts = [json.loads(raw) for raw in client.hgetall("gpuwatch:alerts:firing").values()]
    assert not [a for a in alerts if a["name"] == "GpuUnallocatedAccess"], alerts

    top = result.stdout.split("Ctrl-C stops the demo.", 1)[1]
    rows = {line.split()[0]: line for line in top.splitlines() if "/" in line.split(" ", 1)[0]}
    assert rows["serving/chat-dra-0"].split()[1:3] == ["platform", "running"], top
    assert shared[:12] in rows["serving/chat-dra-1"], top
    # The DRA nodes' GPUs come from their ResourceSlices: 8, of which only chat-dra's shared
    # device (counted once) is held at the end; h100-0 lends 1 of its 4.
    (capacity,) = [line for line in top.splitlines() if line.startswith("capacity:")]
    assert "gpu.nvidia.com/gpu free 7" in capacity, top
    assert capacity.endswith("NVIDIA H100 80GB HBM3 free 3"), top

    # One history: the job's 20 minutes in Kueue's queue, then its pod's life.
    now = time.time()
    span = [time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)) for t in (now - 3600, now + 600)]
    argv = [str(GPUWATCH), "replay", "--pod", "research/train-dra-0", "--from", span[0]]
    replay = run_command([*argv, "--to", span[1]], timeout_s=120, env={**os.environ, **demo_scope})
    assert replay.returncode == 0, replay.stderr + replay.stdout
    kueue = [line for line in replay.stdout.splitlines() if "  kueue  " in line]
    # Waiting, admitted, finished; the bare creation too when the watcher saw the workload
    # before Kueue's scheduler wrote its condition (both in one simulated second).
    assert len(kueue) in (3, 4), replay.stdout
    waiting, admitted, finished = kueue[-3:]
    assert (
        "queued (WaitingForQuota)  couldn't assign flavors to pod set main: insufficient "
        "unused quota for gpu.nvidia.com/gpu in flavor default-flavor, 4 more needed" in waiting
    )
    assert "admitted to ClusterQueue research after 20m00s" in admitted
    assert "finished (Succeeded)" in finished
    # Three minutes in Kueue's queue (the demo's threshold) raised WorkloadQueuedTooLong; the
    # admission resolved it.
    waited = [line for line in replay.stdout.splitlines() if "WorkloadQueuedTooLong" in line]
    assert len(waited) == 2, replay.stdout
    assert "FIRING WorkloadQueuedTooLong (warning)" in waited[0], waited
    assert "queued in Kueue for 180 s (WaitingForQuota) in queue research" in waited[0], waited
    assert "RESOLVED WorkloadQueuedTooLong" in waited[1], waited
    moves = [line for line in replay.stdout.splitlines() if "  lifecycle  " in line]
    assert "new -> queued (Scheduling)" in moves[0]  # not waiting for quota once admitted
    assert "running -> finished (Completed)" in moves[-1]
