"""The `cluster` field, added within v1: absent means the default cluster, both ways."""

import json
from typing import Any

import msgspec
import pytest

from gpuwatch.harness.examples import EXAMPLES
from schemas import ALL_TOPICS, SchemaError, TopicSpec
from schemas.fields import DEFAULT_CLUSTER

CLUSTERED = [spec for spec in ALL_TOPICS if "cluster" in spec.value_type.__struct_fields__]


def test_every_input_and_derived_value_has_the_field() -> None:
    names = {spec.name for spec in CLUSTERED}
    assert names == {
        "nvml.samples",
        "k8s.pods",
        "k8s.nodes",
        "pod.usage",
        "pod.lifecycle",
        "attribution",
        "gpu.windows",
        "alerts",
        "capacity",
        "k8s.workloads",
        "workload.lifecycle",
        "work.units",
    }


@pytest.mark.parametrize("spec", CLUSTERED, ids=lambda s: s.name)
def test_a_message_without_it_is_of_the_default_cluster_and_written_as_it_came(
    spec: TopicSpec[Any],
) -> None:
    message = EXAMPLES[spec.schema_name]
    assert "cluster" not in message
    raw = json.dumps(message).encode()
    value = spec.decode(raw)
    assert value.cluster == DEFAULT_CLUSTER
    assert json.loads(spec.encode(value)) == message


@pytest.mark.parametrize("spec", CLUSTERED, ids=lambda s: s.name)
def test_a_named_cluster_is_kept_and_written(spec: TopicSpec[Any]) -> None:
    message = {**EXAMPLES[spec.schema_name], "cluster": "eu-west-1.inference"}
    value = spec.decode(json.dumps(message).encode())
    assert value.cluster == "eu-west-1.inference"
    assert json.loads(spec.encode(value)) == message
    assert msgspec.structs.replace(value, cluster=DEFAULT_CLUSTER) != value


@pytest.mark.parametrize("name", ["", "a/b", "train cluster", "-lead", "x" * 64, 7, None])
def test_a_cluster_name_that_cannot_be_a_key_part_or_label_value_is_refused(name: Any) -> None:
    spec = CLUSTERED[0]
    message = {**EXAMPLES[spec.schema_name], "cluster": name}
    with pytest.raises(SchemaError, match="cluster"):
        spec.decode(json.dumps(message).encode())


@pytest.mark.parametrize("spec", CLUSTERED, ids=lambda s: s.name)
def test_the_default_cluster_named_as_such_is_left_out_too(spec: TopicSpec[Any]) -> None:
    message = EXAMPLES[spec.schema_name]
    named = spec.decode(json.dumps({**message, "cluster": "default"}).encode())
    assert json.loads(spec.encode(named)) == message
    from_setting = "".join(["def", "ault"])  # a string equal to the default, not the same one
    made = msgspec.structs.replace(spec.decode(json.dumps(message).encode()), cluster=from_setting)
    assert json.loads(spec.encode(made)) == message
