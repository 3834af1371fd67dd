"""A topic another worker has just created shows no partitions for a moment: the partition
count is asked again until it has some, instead of refusing to start."""

from __future__ import annotations

from typing import Any

import pytest
from kafka.admin import NewTopic
from kafka.errors import TopicAlreadyExistsError

from gpuwatch import kafka


class Admin:
    """An admin client whose topic exists already and shows its partitions late."""

    def __init__(self, empty_answers: int, partitions: int = 3) -> None:
        self.empty_answers = empty_answers
        self.partitions = partitions
        self.described = 0

    def create_topics(self, topics: list[NewTopic], **_: Any) -> None:
        raise TopicAlreadyExistsError()

    def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        self.described += 1
        count = 0 if self.described <= self.empty_answers else self.partitions
        return [{"name": names[0], "partitions": [{"partition": p} for p in range(count)]}]


def test_partitions_that_show_late_are_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda _: None)
    admin = Admin(empty_answers=3)
    assert kafka.ensure_topic(admin, NewTopic("t", 3, 1)) == 3  # type: ignore[arg-type]
    assert admin.described == 4


def test_a_topic_that_never_shows_partitions_is_reported_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda _: None)
    monkeypatch.setattr(kafka, "SETTLE_S", 0.0)
    admin = Admin(empty_answers=10**6)
    assert kafka.ensure_topic(admin, NewTopic("t", 3, 1)) == 0  # type: ignore[arg-type]
