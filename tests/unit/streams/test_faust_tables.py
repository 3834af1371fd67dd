"""The worker's state table: what a partition loads is what was written, large values kept
compressed in memory, the changelog given every value as written."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from streams.faust.tables import PACK_MIN_BYTES, FaustTable


@dataclass
class _Topic:
    name: str

    def get_topic_name(self) -> str:
        return self.name


@dataclass
class _Table:
    changelog_topic: _Topic = field(default_factory=lambda: _Topic("state.changelog"))
    data: dict[bytes, bytes] = field(default_factory=dict)


@dataclass
class _Batches:
    added: list[tuple[str, bytes | None, bytes | None, int | None]] = field(default_factory=list)

    def add(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None
    ) -> None:
        self.added.append((topic, key, value, partition))


def _table() -> tuple[FaustTable, _Table, _Batches]:
    faust_table, batches = _Table(), _Batches()
    table: Any = FaustTable(faust_table, batches)  # type: ignore[arg-type]
    return table, faust_table, batches


def _document(n: int) -> bytes:
    windows = [
        {"uuid": f"GPU-{i:04d}", "seconds": 20.0, "util_seconds": 19.4 + i} for i in range(n)
    ]
    return json.dumps({"node": "node-1", "windows": windows}).encode()


def test_a_partition_loads_what_was_written_large_values_kept_smaller() -> None:
    table, faust_table, batches = _table()
    large, small = _document(60), b'{"uid":"u1","state":"running"}'
    assert len(large) >= PACK_MIN_BYTES > len(small)
    table.write(3, b"node-1", large)
    table.write(3, b"u1", small)
    table.write(4, b"node-2", large)
    assert sorted(table.load(3)) == [(b"node-1", large), (b"u1", small)]
    assert table.load(4) == [(b"node-2", large)]
    kept = faust_table.data[b"3|node-1"]
    assert len(kept) < len(large) / 2
    assert faust_table.data[b"3|u1"] == small
    # The changelog has the values as written, the partition explicitly.
    assert batches.added[0] == ("state.changelog", b"3|node-1", large, 3)
    assert [value for _, _, value, _ in batches.added] == [large, small, large]


def test_values_restored_from_the_changelog_are_read_as_they_are() -> None:
    table, faust_table, _ = _table()
    restored = _document(60)
    faust_table.data[b"2|node-9"] = restored  # as Faust's recovery puts it
    assert table.load(2) == [(b"node-9", restored)]


def test_a_deleted_key_is_gone_locally_and_in_the_changelog() -> None:
    table, faust_table, batches = _table()
    table.write(1, b"node-1", _document(60))
    table.write(1, b"node-1", None)
    table.write(1, b"never-written", None)
    assert table.load(1) == []
    assert faust_table.data == {}
    assert batches.added[-2:] == [
        ("state.changelog", b"1|node-1", None, 1),
        ("state.changelog", b"1|never-written", None, 1),
    ]


def test_keys_of_partitions_not_kept_are_forgotten() -> None:
    table, _, _ = _table()
    for partition in (1, 2, 11):
        table.write(partition, b"node", _document(60))
    table.keep_only({2})
    assert table.load(1) == []
    assert table.load(11) == []
    assert table.load(2) == [(b"node", _document(60))]
