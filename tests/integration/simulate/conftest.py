"""Fixtures of the simulator's integration tests: topics of the test's own, the JSON Schemas,
no thread left behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from topic_io import scoped_topics

from schemas import K8S_NODES, K8S_PODS, NVML_SAMPLES, WORK_UNITS
from schemas.export import JSON_DIR
from schemas.settings import Settings


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def scoped(stack: Settings, topic_prefix: str) -> Iterator[Settings]:
    """The stack's settings with topics of this test alone (3 partitions), deleted after."""
    yield from scoped_topics(stack, topic_prefix)


@pytest.fixture(scope="session")
def validators() -> dict[str, Draft202012Validator]:
    """The committed JSON Schemas of the producers' topics, by topic name."""
    out = {}
    for spec in (NVML_SAMPLES, K8S_PODS, K8S_NODES, WORK_UNITS):
        document: dict[str, Any] = json.loads(
            (JSON_DIR / spec.json_schema_file).read_text(encoding="utf-8")
        )
        Draft202012Validator.check_schema(document)
        out[spec.name] = Draft202012Validator(document)
    return out
