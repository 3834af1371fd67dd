"""`small` simulated into the real local Kafka: what lands in nvml.samples, k8s.pods,
k8s.nodes and work.units validates and shows the scenario's pods in the phases it gives
and their units of work scraped whole; and `gpuwatch simulate` as a user runs it."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from topic_io import consume_all

from gpuwatch.harness.simulate.runner import run_simulation
from gpuwatch.harness.simulate.scenario import load_scenario
from schemas import K8S_NODES, K8S_PODS, NVML_SAMPLES, WORK_UNITS, K8sPod, NvmlSample, TopicSpec
from schemas.settings import Settings
from schemas.work_units import WorkUnits

pytestmark = pytest.mark.integration

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
S = 1000
SIMULATED_S = 330  # past bert-oom's OOM kill at 275 s, before vision-train completes at 605 s
SCRAPE_S = 15  # the agents' work_interval_s: scrapes at the event times on its grid
FIRST_SCRAPE_S = 3  # the epoch is put so: before vision-train's containers run (5 s)
WORK = {  # small's pods that count units of work: running since (s), units a second
    "chat-serving-0": (-86_400, {"tokens": 1500.0, "requests": 3.0}),
    "llm-finetune-0": (-1800, {"steps": 4.0}),
    "vision-train-0": (5, {"steps": 10.0}),  # pulled 0 .. 5 s
    "vision-train-1": (5, {"steps": 10.0}),
}


def decoded(settings: Settings, spec: TopicSpec[Any], validator: Draft202012Validator) -> list[Any]:
    """Every record of the topic, validated against its JSON Schema, decoded, key checked."""
    values = []
    for record in consume_all(settings, spec.full_name(settings.kafka.topic_prefix)):
        errors = [e.message for e in validator.iter_errors(json.loads(record.value))]
        assert errors == [], f"{spec.name} offset {record.offset}: {errors}"
        value = spec.decode(record.value)
        assert record.key == spec.key_of(value).encode()
        values.append(value)
    return values


def test_small_lands_in_kafka_valid_with_its_pods_in_their_phases(
    scoped: Settings, validators: dict[str, Draft202012Validator]
) -> None:
    hour_ago = int(time.time()) - 3600
    # On the scrape grid (epoch seconds a multiple of 15) plus 12: the first scrape at 3 s.
    epoch = hour_ago - hour_ago % SCRAPE_S + SCRAPE_S - FIRST_SCRAPE_S

    summary = run_simulation(
        scoped,
        load_scenario("small"),
        speed=100,
        until_s=SIMULATED_S,
        duration_s=60,  # a safety net: 330 ticks take 3.3 s at this speed
        epoch_s=epoch,
    )

    assert summary.ticks == SIMULATED_S
    # small queues nothing in Kueue: no workload.
    assert summary.sent == {
        "nvml.samples": 3 * SIMULATED_S, "k8s.pods": 18, "k8s.nodes": 3, "k8s.workloads": 0,
        "work.units": summary.work_records,
    }  # fmt: skip
    assert summary.dropped == {
        "nvml.samples": 0, "k8s.pods": 0, "k8s.nodes": 0, "k8s.workloads": 0, "work.units": 0
    }  # fmt: skip
    samples: list[NvmlSample] = decoded(scoped, NVML_SAMPLES, validators[NVML_SAMPLES.name])
    pods: list[K8sPod] = decoded(scoped, K8S_PODS, validators[K8S_PODS.name])
    nodes = decoded(scoped, K8S_NODES, validators[K8S_NODES.name])
    work: list[WorkUnits] = decoded(scoped, WORK_UNITS, validators[WORK_UNITS.name])

    assert sorted(n.node for n in nodes) == ["h100-0", "h100-1", "l40s-0"]
    assert {n.node: n.gpu_capacity for n in nodes}["l40s-0"] == {"nvidia.com/gpu": 8}
    check_samples(samples, epoch)
    check_pods(pods, epoch)
    check_work(work, summary.scrapes, summary.work_records, epoch)


def check_samples(samples: list[NvmlSample], epoch: int) -> None:
    by_node: dict[str, list[NvmlSample]] = {}
    for sample in samples:
        by_node.setdefault(sample.node, []).append(sample)
    assert sorted(by_node) == ["h100-0", "h100-1", "l40s-0"]
    for node, mine in by_node.items():
        mine.sort(key=lambda s: s.seq)
        assert [s.seq for s in mine] == list(range(SIMULATED_S)), node
        assert [s.ts for s in mine] == [(epoch + i) * S for i in range(SIMULATED_S)], node
        assert {s.interval_ms for s in mine} == {S}
    # h100-0: chat-serving, llm-finetune (2 GPUs) and, from 30 s until 275 s, bert-oom.
    pods_0 = [sorted(a.pod for a in s.allocations) for s in by_node["h100-0"]]
    assert pods_0[29] == ["chat-serving-0", "llm-finetune-0"]
    assert pods_0[30] == ["bert-oom-0", "chat-serving-0", "llm-finetune-0"]
    assert pods_0[274] == pods_0[30]
    assert pods_0[275] == pods_0[29]
    bert_gpu = next(a for a in by_node["h100-0"][100].allocations if a.pod == "bert-oom-0")
    (gpu,) = [g for g in by_node["h100-0"][100].gpus if g.uuid in bert_gpu.device_ids]
    assert [p.pod_uid for p in gpu.processes] == [bert_gpu.pod_uid]
    utils = [g.util_pct for s in by_node["h100-0"][40:270] for g in s.gpus if g.uuid == gpu.uuid]
    assert len(utils) == 230
    assert 60 < sum(u or 0 for u in utils) / len(utils) <= 100  # training, data-loader pauses
    # The L40S node: three dev pods time-slicing its two GPUs, two on GPU 0.
    shared = by_node["l40s-0"][10]
    assert {g.sharing for g in shared.gpus} == {"time-slicing"}
    holders = sorted(len(g.processes) for g in shared.gpus)
    assert holders == [1, 2]
    assert len(shared.allocations) == 3
    assert all("::" not in d for a in shared.allocations for d in a.device_ids)


def check_pods(pods: list[K8sPod], epoch: int) -> None:
    final = {pod.name: pod for pod in pods}
    assert {name: pod.phase for name, pod in final.items()} == {
        "chat-serving-0": "Running",
        "notebook-ana-0": "Running",
        "llm-finetune-0": "Running",
        "dev-0": "Running",
        "dev-1": "Running",
        "dev-2": "Running",
        "vision-train-0": "Running",
        "vision-train-1": "Running",
        "bert-oom-0": "Failed",
        "eval-sweep-0": "Pending",
    }
    bert = final["bert-oom-0"]
    assert [(c.state, c.reason, c.exit_code) for c in bert.containers] == [
        ("terminated", "OOMKilled", 137)
    ]
    assert (bert.finished_at, bert.started_at) == ((epoch + 30) * S + 245 * S, (epoch + 30) * S)
    assert bert.node == "h100-0"
    assert bert.labels == {
        "team": "nlp",
        "project": "bert-large",
        "app.kubernetes.io/name": "bert-oom",
    }
    assert bert.owner is not None
    assert (bert.owner.kind, bert.owner.name) == ("Job", "bert-oom")
    # bert-oom's story, one message per change, each at the time it happened.
    story = [(p.type, p.phase, p.ts // S - epoch) for p in pods if p.name == "bert-oom-0"]
    assert story == [
        ("ADDED", "Pending", 30),  # created
        ("MODIFIED", "Pending", 30),  # bound, ContainerCreating
        ("MODIFIED", "Running", 35),
        ("MODIFIED", "Failed", 275),
    ]
    sweep = final["eval-sweep-0"]
    assert (sweep.node, sweep.created_at, sweep.gpu_request) == (
        None,
        (epoch + 60) * S,
        {"nvidia.com/gpu": 2},
    )
    assert [(c.type, c.status, c.reason) for c in sweep.conditions] == [
        ("PodScheduled", "False", "Unschedulable")
    ]
    vision = final["vision-train-0"]
    assert (vision.node, vision.started_at) == ("h100-1", epoch * S)
    assert [(c.state, c.restarts) for c in vision.containers] == [("running", 0)]


def check_work(work: list[WorkUnits], scrapes: dict[str, int], made: int, epoch: int) -> None:
    """Each pod counting units of work is scraped on the grid from when it runs, the
    first scrape its baseline; every record after it is in work.units once (a copy the
    publisher sent again is the same record), and together they tile the pod's time
    from its baseline to its last scrape with every unit it did in that time."""
    grid = [t for t in range(1, SIMULATED_S + 1) if (epoch + t) % SCRAPE_S == 0]
    assert grid[0] == FIRST_SCRAPE_S
    scraped = {pod: [t for t in grid if t > since] for pod, (since, _) in WORK.items()}
    assert [len(times) for times in scraped.values()] == [22, 22, 21, 21]
    records: dict[tuple[str, int, int], WorkUnits] = {}
    for record in work:
        kept = records.setdefault((record.uid, record.start, record.ts), record)
        assert kept == record, "a record repeated with another content"
    by_pod: dict[str, list[WorkUnits]] = {}
    for record in sorted(records.values(), key=lambda r: r.ts):
        by_pod.setdefault(record.pod, []).append(record)
    assert sorted(by_pod) == sorted(WORK)
    for pod, (_, rates) in WORK.items():
        mine = by_pod[pod]
        assert [(r.start // S - epoch, r.ts // S - epoch) for r in mine] == list(
            itertools.pairwise(scraped[pod])
        ), pod
        for record in mine:
            seconds = (record.ts - record.start) / S
            assert record.units == {u: rate * seconds for u, rate in rates.items()}, pod
            assert (record.resets, record.missing) == ((), ())
    # What the scrapers made, no more, no less, and no scrape of a pod before it ran.
    assert made == len(records) == sum(len(t) - 1 for t in scraped.values())
    ok = sum(len(times) for times in scraped.values())
    assert scrapes == {"ok": ok, "failed": 0, "too_large": 0, "bad_exposition": 0}


def test_the_simulate_command_runs_a_scenario_and_prints_where_pods_ended(
    scoped: Settings,
) -> None:
    argv = [str(GPUWATCH), "simulate", "--scenario", "incident", "--speed", "100"]
    argv += ["--until", "40", "--duration", "30", "--epoch", "2025-11-29T10:00:00Z"]
    # --no-metrics: the agents' port is taken (as by a demo running here), and no matter.
    argv += ["--no-metrics"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = {
            **os.environ,
            "GPUWATCH_TOPIC_PREFIX": scoped.kafka.topic_prefix,
            "GPUWATCH_KAFKA_BOOTSTRAP": scoped.kafka.bootstrap,
            "GPUWATCH_AGENT_METRICS_PORT": str(taken.getsockname()[1]),
        }
        done = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=60, check=False
        )

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("scenario incident (seed 42): 3 nodes, 12 GPUs, 40 s simulated")
    assert lines[1].startswith("published: nvml.samples 120 sent, k8s.pods ")
    assert "  nlp/broken-trainer-0" in done.stdout
    broken = next(line for line in lines if "broken-trainer-0" in line)
    assert broken.split()[-1] == "CrashLoopBackOff"  # crashed at 35 s, back at 45 s
    assert "simulation stopped scenario=incident ticks=40" in done.stderr


def test_the_simulate_command_refuses_a_bad_scenario_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nnodes:\n  - pool: a\n    count: many\n", encoding="utf-8")

    done = subprocess.run(
        [str(GPUWATCH), "simulate", "--scenario", str(bad), "--no-topic-check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"gpuwatch: {bad}: Expected `int`, got `str` - at `$.nodes[0].count`"
    )
