"""Every topic of docs/DESIGN.md §3 is specified with the right key, schema and configuration."""

import base64
import json
import subprocess
import sys
from typing import Any, Literal

import msgspec
import pytest

from gpuwatch.harness.examples import EXAMPLES
from schemas import (
    ALL_TOPICS,
    DEADLETTER,
    DEFAULT_TOPIC_PREFIX,
    NVML_SAMPLES,
    POD_KEYED,
    Codec,
    DeadLetter,
    TopicSpec,
    by_name,
)
from schemas.export import JSON_DIR

ROOT = JSON_DIR.parent.parent  # the repository root, where `schemas` is a regular package

DAY_MS = 86_400_000

# docs/DESIGN.md §3: topic, key, value schema, in the table's order (`capacity` added
# before the dead letters).
DESIGN_TOPICS = [
    ("nvml.samples", "node", "gpuwatch.nvml.sample/v1"),
    ("k8s.pods", "pod_uid", "gpuwatch.k8s.pod/v1"),
    ("k8s.nodes", "node", "gpuwatch.k8s.node/v1"),
    ("pod.usage", "pod_uid", "gpuwatch.pod.usage/v1"),
    ("pod.lifecycle", "pod_uid", "gpuwatch.pod.lifecycle/v1"),
    ("attribution", "pod_uid", "gpuwatch.attribution/v1"),
    ("gpu.windows", "gpu_uuid", "gpuwatch.gpu.window/v1"),
    ("alerts", "alert_fingerprint", "gpuwatch.alert/v1"),
    ("capacity", "cluster/product/resource", "gpuwatch.capacity/v1"),
    ("k8s.workloads", "workload_uid", "gpuwatch.k8s.workload/v1"),  # added: Kueue
    ("workload.lifecycle", "workload_uid", "gpuwatch.workload.lifecycle/v1"),  # added: Kueue
    ("work.units", "pod_uid", "gpuwatch.work.units/v1"),  # added: units of work
    ("deadletter", "source_topic", "gpuwatch.deadletter/v1"),
]

# The field of each value that the key is made of.
KEY_FIELD = {
    "node": "node",
    "pod_uid": "uid",
    "gpu_uuid": "uuid",
    "alert_fingerprint": "fingerprint",
    "source_topic": "source_topic",
    "workload_uid": "uid",
}


def test_all_topics_are_the_design_table_in_order() -> None:
    assert [(s.name, s.key, s.schema_name) for s in ALL_TOPICS] == DESIGN_TOPICS


def test_pod_keyed_topics_are_exactly_those_keyed_by_pod_uid() -> None:
    assert [s.name for s in POD_KEYED] == [
        "k8s.pods", "pod.usage", "pod.lifecycle", "attribution", "work.units"
    ]  # fmt: skip


def test_only_pod_usage_is_internal() -> None:
    assert [s.name for s in ALL_TOPICS if s.internal] == ["pod.usage"]


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_key_of_a_value_is_the_field_the_key_names(spec: TopicSpec[Any]) -> None:
    message = EXAMPLES[spec.schema_name]
    value = spec.decode(json.dumps(message))
    if spec.key == "cluster/product/resource":
        assert spec.key_of(value) == f"{message['product']}/{message['resource']}"
        named = spec.decode(json.dumps({**message, "cluster": "east"}))
        assert spec.key_of(named) == f"east/{message['product']}/{message['resource']}"
        unlabelled = spec.decode(json.dumps({**message, "product": None}))
        assert spec.key_of(unlabelled) == f"{message['model']}/{message['resource']}"
        return
    assert spec.key_of(value) == message[KEY_FIELD[spec.key]]


def test_names_and_files() -> None:
    assert NVML_SAMPLES.full_name(DEFAULT_TOPIC_PREFIX) == "gpuwatch.nvml.samples"
    assert NVML_SAMPLES.full_name("gwtest-1.") == "gwtest-1.nvml.samples"
    assert NVML_SAMPLES.json_schema_file == "gpuwatch.nvml.sample.v1.json"
    assert by_name("deadletter") is DEADLETTER
    with pytest.raises(KeyError):
        by_name("gpuwatch.deadletter")


def test_retention_fits_what_each_topic_is_for() -> None:
    retention = {s.name: s.retention_ms for s in ALL_TOPICS}
    assert all(r is not None and r >= DAY_MS for r in retention.values())
    assert not any(s.compacted for s in ALL_TOPICS)  # replay needs history, not last values
    assert (retention["attribution"] or 0) >= 31 * DAY_MS  # a calendar month of chargeback
    # Raw, high-volume input is kept the shortest; derived records outlive it.
    shortest = min(r for r in retention.values() if r is not None)
    assert retention["nvml.samples"] == retention["pod.usage"] == shortest


def test_codec_refuses_a_type_without_a_schema_literal() -> None:
    class Untagged(msgspec.Struct, frozen=True, kw_only=True):
        schema: str
        ts: int

    class Defaulted(msgspec.Struct, frozen=True, kw_only=True):
        schema: Literal["x/v1"] = "x/v1"  # not required: a message without it would pass

    for bad in (Untagged, Defaulted):
        with pytest.raises(TypeError, match="needs a required `schema: Literal"):
            Codec(bad)


@pytest.mark.parametrize(
    ("raw", "encoding"),
    [
        (b'{"schema": "gpuwatch.nvml.sample/v1", "ts": "soon"}', "utf-8"),
        ("gr\u00fc\u00dfe \u2603".encode(), "utf-8"),
        (b"\xff\xfe\x00\x80binary", "base64"),
        (b"", "utf-8"),
    ],
)
def test_deadletter_keeps_the_raw_bytes(raw: bytes, encoding: str) -> None:
    letter = DeadLetter.from_bytes(
        source_topic="gpuwatch.nvml.samples", ts=1764412345120, error="bad", raw=raw, key=b"n\xff"
    )
    assert letter.raw_encoding == encoding
    assert (letter.partition, letter.offset, letter.key) == (-1, -1, "n\ufffd")
    again = DEADLETTER.decode(DEADLETTER.encode(letter))
    assert again == letter
    assert again.raw_bytes() == raw
    if encoding == "base64":
        assert base64.b64decode(letter.raw) == raw


def test_deadletter_with_corrupt_base64_says_so() -> None:
    message = EXAMPLES["gpuwatch.deadletter/v1"] | {"raw": "@@not base64", "raw_encoding": "base64"}
    with pytest.raises(ValueError, match="not valid base64"):
        DEADLETTER.decode(json.dumps(message)).raw_bytes()


def test_schemas_imports_no_io_library() -> None:
    forbidden = ["kafka", "aiokafka", "faust", "redis", "kubernetes", "pynvml", "prometheus_client"]
    code = (
        "import sys, schemas, schemas.export, gpuwatch.harness.examples;"
        f"print([m for m in {forbidden!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert done.stdout.strip() == "[]"
