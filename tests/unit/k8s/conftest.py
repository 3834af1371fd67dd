"""Fixtures of the watcher's tests: recorded API objects."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


def load(name: str) -> dict[str, Any]:
    """A recorded object from fixtures/ (`pod-evicted`)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return data


@pytest.fixture
def fixture() -> Callable[[str], dict[str, Any]]:
    return load
