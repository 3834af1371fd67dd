"""Fixtures of the worker's integration tests: scoped topics, worker processes, JSON Schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from topic_io import NewScope
from worker_fixtures import StartWorker, worker_starter

from schemas import ALL_TOPICS
from schemas.export import JSON_DIR
from schemas.settings import Settings


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def scoped(new_scope: NewScope) -> Settings:
    """One scope of this test alone."""
    return new_scope()


@pytest.fixture
def start_worker(tmp_path: Path) -> Iterator[StartWorker]:
    """Start `gpuwatch worker` processes; every one is stopped (SIGTERM) after the test."""
    with worker_starter(tmp_path) as start:
        yield start


@pytest.fixture(scope="session")
def validators() -> dict[str, Draft202012Validator]:
    """The committed JSON Schema of every topic's values, by unprefixed topic name."""
    out = {}
    for spec in ALL_TOPICS:
        document = json.loads((JSON_DIR / spec.json_schema_file).read_text(encoding="utf-8"))
        Draft202012Validator.check_schema(document)
        out[spec.name] = Draft202012Validator(document)
    return out
