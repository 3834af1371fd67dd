"""Fixtures of the node agent's integration tests: topics, a consumer, the schema, threads."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from kafka.consumer.fetcher import ConsumerRecord
from support import free_port
from topic_io import consume_all, scoped_topics

from schemas import NVML_SAMPLES
from schemas.export import JSON_DIR
from schemas.settings import Settings

Consume = Callable[[Settings, str], list[ConsumerRecord]]


@pytest.fixture(autouse=True)
def _no_thread_left(no_thread_left: None) -> None:
    """Every test here: no thread left running (tests/conftest.py)."""


@pytest.fixture
def port() -> Callable[[], int]:
    """A port nobody listens on now."""
    return free_port


@pytest.fixture
def scoped(stack: Settings, topic_prefix: str) -> Iterator[Settings]:
    """The shared stack's settings with topics of this test alone."""
    yield from scoped_topics(stack, topic_prefix)


@pytest.fixture(scope="session")
def consume() -> Consume:
    return consume_all


@pytest.fixture(scope="session")
def nvml_schema() -> Draft202012Validator:
    """The committed JSON Schema of `gpuwatch.nvml.sample/v1`."""
    path = JSON_DIR / NVML_SAMPLES.json_schema_file
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(document)
    return Draft202012Validator(document)
