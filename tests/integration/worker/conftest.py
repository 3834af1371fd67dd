"""Fixtures of the worker's integration tests: scoped topics, worker processes, JSON Schemas."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from kafka import KafkaAdminClient
from worker_fixtures import GPUWATCH, PARTITIONS, WORKER_ENV, NewScope, StartWorker, Worker

from gpuwatch.topics import create_topics
from schemas import ALL_TOPICS
from schemas.export import JSON_DIR
from schemas.settings import Settings


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    """Fail a test that leaves a thread running (a Kafka client's I/O thread)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 10
    while (left := set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"threads left running: {sorted(t.name for t in left)}"


@pytest.fixture
def new_scope(stack: Settings) -> Iterator[NewScope]:
    """Settings with a topic prefix and app id of their own, topics created; deleted after."""
    prefixes: list[str] = []
    groups: list[str] = []

    def scope() -> Settings:
        tag = uuid.uuid4().hex[:10]
        prefixes.append(f"gwtest-{tag}.")
        kafka = stack.kafka.model_copy(
            update={
                "topic_prefix": prefixes[-1],
                "partitions": PARTITIONS,
                "app_id": f"gwtest-app-{tag}",
            }
        )
        scoped = stack.model_copy(update={"kafka": kafka})
        groups.append(kafka.app_id)
        rows = create_topics(scoped)
        assert all(row.ok for row in rows), rows
        return scoped

    yield scope
    admin = KafkaAdminClient(**stack.kafka.client_options())
    try:
        names = [n for n in admin.list_topics() if any(n.startswith(p) for p in prefixes)]
        if names:
            admin.delete_topics(names)
        known = {g["group_id"] for g in admin.list_groups()}
        if gone := [g for g in groups if g in known]:
            admin.delete_groups(gone)  # the workers have stopped: the groups are empty
    finally:
        admin.close()


@pytest.fixture
def scoped(new_scope: NewScope) -> Settings:
    """One scope of this test alone."""
    return new_scope()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[StartWorker]:
    """Start `gpuwatch worker` processes; every one is stopped (SIGTERM) after the test."""
    started: list[Worker] = []

    def start(settings: Settings, instance: str = "w1") -> Worker:
        env = {
            **os.environ,
            **WORKER_ENV,
            "GPUWATCH_TOPIC_PREFIX": settings.kafka.topic_prefix,
            "GPUWATCH_APP_ID": settings.kafka.app_id,
            "GPUWATCH_KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
            "GPUWATCH_KAFKA_PARTITIONS": str(settings.kafka.partitions),
        }
        argv = [str(GPUWATCH), "worker", "--tick-interval", "0.5", "--session-timeout", "6"]
        argv += ["--instance", instance]
        log_path = tmp_path / f"worker-{len(started)}-{instance}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        started.append(Worker(process, log_path))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def validators() -> dict[str, Draft202012Validator]:
    """The committed JSON Schema of every topic's values, by unprefixed topic name."""
    out = {}
    for spec in ALL_TOPICS:
        document = json.loads((JSON_DIR / spec.json_schema_file).read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(document)
        out[spec.name] = Draft202012Validator(document)
    return out
