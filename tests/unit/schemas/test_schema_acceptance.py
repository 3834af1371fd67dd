"""Acceptance cases of the wire contracts: the docs/DESIGN.md examples, bad messages, errors."""

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpuwatch.harness.examples import EXAMPLES, GPU_0, POD_UID, example
from schemas import (
    ALL_TOPICS,
    K8S_PODS,
    NVML_SAMPLES,
    MalformedJSON,
    NvmlSample,
    SchemaError,
    TopicSpec,
    UnknownSchemaVersion,
    WrongSchema,
)
from schemas.export import JSON_DIR

# docs/DESIGN.md §3.1 and §3.2, verbatim; only the elided uuids ("...") differ.
DESIGN_NVML_SAMPLE = """
{"schema": "gpuwatch.nvml.sample/v1", "node": "gpu-node-17",
 "ts": 1764412345000, "interval_ms": 1000, "seq": 81234,
 "gpus": [{
   "uuid": "GPU-8f3c...", "index": 0, "model": "NVIDIA H100 80GB HBM3",
   "parent_uuid": null, "mig_profile": null,
   "sharing": "exclusive",
   "util_pct": 87.0, "mem_util_pct": 41.0,
   "mem_used_bytes": 61203283968, "mem_total_bytes": 85520809984,
   "power_w": 512.3, "temp_c": 61, "xid_errors": [], "ecc_dbe": 0,
   "processes": [{"pid": 4242, "mem_bytes": 60129542144, "sm_pct": 85.0,
                  "pod_uid": "6f1c...", "container": "trainer"}]}],
 "allocations": [{"pod_uid": "6f1c...", "namespace": "ml", "pod": "train-0",
                  "container": "trainer", "resource": "nvidia.com/gpu",
                  "device_ids": ["GPU-8f3c..."]}]}
"""
DESIGN_K8S_POD = """
{"schema": "gpuwatch.k8s.pod/v1", "type": "MODIFIED", "ts": 1764412345000,
 "resource_version": "912345", "uid": "6f1c...", "namespace": "ml", "name": "train-0",
 "node": "gpu-node-17", "phase": "Running",
 "created_at": 1764400000000, "scheduled_at": 1764400002000,
 "started_at": 1764400030000, "finished_at": null,
 "gpu_request": {"nvidia.com/gpu": 1},
 "conditions": [{"type": "PodScheduled", "status": "True", "reason": null, "message": null}],
 "containers": [{"name": "trainer", "state": "running", "reason": null,
                 "exit_code": null, "restarts": 0}],
 "labels": {"team": "vision", "project": "llm-pretrain"},
 "owner": {"kind": "Job", "name": "llm-pretrain"},
 "priority_class": "research", "queue": null}
"""


def _design(text: str) -> dict[str, Any]:
    completed = text.replace('"GPU-8f3c..."', json.dumps(GPU_0))
    return dict(json.loads(completed.replace('"6f1c..."', json.dumps(POD_UID))))


def _validator(spec: TopicSpec[Any]) -> Draft202012Validator:
    path = Path(JSON_DIR, spec.json_schema_file)
    return Draft202012Validator(json.loads(path.read_text(encoding="utf-8")))


def _raw(message: Any) -> bytes:
    return json.dumps(message).encode()


@pytest.mark.parametrize(
    ("spec", "text"), [(NVML_SAMPLES, DESIGN_NVML_SAMPLE), (K8S_PODS, DESIGN_K8S_POD)]
)
def test_design_example_is_the_documented_example_and_valid(
    spec: TopicSpec[Any], text: str
) -> None:
    message = _design(text)
    assert message == EXAMPLES[spec.schema_name]
    assert _validator(spec).is_valid(message)
    assert json.loads(spec.encode(spec.decode(_raw(message)))) == message
    assert _validator(spec).is_valid(json.loads(text))  # even with the elided uuids
    spec.decode(text)


def test_design_nvml_sample_decodes_to_typed_values() -> None:
    sample = NVML_SAMPLES.decode(_raw(_design(DESIGN_NVML_SAMPLE)))
    assert isinstance(sample, NvmlSample)
    assert (sample.node, sample.ts, sample.interval_ms) == ("gpu-node-17", 1764412345000, 1000)
    gpu = sample.gpus[0]
    assert (gpu.util_pct, gpu.parent_uuid, gpu.xid_errors) == (87.0, None, ())
    assert gpu.processes[0].pod_uid == sample.allocations[0].pod_uid == POD_UID
    assert sample.allocations[0].device_ids == (GPU_0,)


def _first_string_field(message: dict[str, Any]) -> str:
    return next(k for k, v in message.items() if k != "schema" and isinstance(v, str))


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_missing_ts_is_rejected(spec: TopicSpec[Any]) -> None:
    message = example(spec.schema_name)
    del message["ts"]
    assert not _validator(spec).is_valid(message)
    with pytest.raises(SchemaError, match=r"\$\.ts: Object missing required field `ts`") as err:
        spec.decode(_raw(message))
    assert err.value.field == "$.ts"


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_string_ts_is_rejected(spec: TopicSpec[Any]) -> None:
    message = example(spec.schema_name) | {"ts": "1764412345000"}
    assert not _validator(spec).is_valid(message)
    with pytest.raises(SchemaError) as err:
        spec.decode(_raw(message))
    assert str(err.value) == f"{spec.schema_name}: $.ts: Expected `int`, got `str`"


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_wrong_type_in_a_required_field_is_rejected(spec: TopicSpec[Any]) -> None:
    message = example(spec.schema_name)
    field = _first_string_field(message)
    message[field] = 12345
    assert not _validator(spec).is_valid(message)
    with pytest.raises(SchemaError) as err:
        spec.decode(_raw(message))
    assert (err.value.schema, err.value.field) == (spec.schema_name, f"$.{field}")
    assert "got `int`" in err.value.reason


def test_missing_nested_field_names_its_full_path() -> None:
    message = example("gpuwatch.nvml.sample/v1")
    del message["gpus"][0]["uuid"]
    with pytest.raises(SchemaError) as err:
        NVML_SAMPLES.decode(_raw(message))
    assert err.value.field == "$.gpus[0].uuid"
    assert str(err.value) == (
        "gpuwatch.nvml.sample/v1: $.gpus[0].uuid: Object missing required field `uuid`"
    )


def test_another_major_version_is_unknown_schema_version() -> None:
    message = example("gpuwatch.nvml.sample/v1") | {"schema": "gpuwatch.nvml.sample/v2"}
    with pytest.raises(UnknownSchemaVersion) as err:
        NVML_SAMPLES.decode(_raw(message))
    assert err.value.field == "$.schema"
    assert "unknown major version 'gpuwatch.nvml.sample/v2'" in err.value.reason
    assert "supported: v1" in err.value.reason


def test_a_v2_with_changed_fields_still_reports_the_version_first() -> None:
    message = {"schema": "gpuwatch.nvml.sample/v2", "ts": "2025-11-29T10:12:25Z", "gpus": {}}
    with pytest.raises(UnknownSchemaVersion):
        NVML_SAMPLES.decode(_raw(message))


def test_a_pod_event_decoded_as_a_sample_is_wrong_schema() -> None:
    with pytest.raises(WrongSchema) as err:
        NVML_SAMPLES.decode(_raw(EXAMPLES["gpuwatch.k8s.pod/v1"]))
    assert err.value.reason == "expected 'gpuwatch.nvml.sample/v1', got 'gpuwatch.k8s.pod/v1'"


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (None, "`schema` must be a string, got None"),
        (1, "`schema` must be a string, got 1"),
        ("x" * 200, "expected 'gpuwatch.nvml.sample/v1', got 'xxxx"),
    ],
)
def test_bad_schema_field_is_wrong_schema(schema: object, reason: str) -> None:
    message = example("gpuwatch.nvml.sample/v1") | {"schema": schema}
    with pytest.raises(WrongSchema) as err:
        NVML_SAMPLES.decode(_raw(message))
    assert err.value.reason.startswith(reason)
    assert len(str(err.value)) < 200  # a foreign value is shown shortened


def test_missing_schema_field_is_wrong_schema() -> None:
    message = example("gpuwatch.k8s.pod/v1")
    del message["schema"]
    with pytest.raises(WrongSchema, match="the `schema` field is missing"):
        K8S_PODS.decode(_raw(message))


@pytest.mark.parametrize(
    "raw", [b"not json", b"[1]", b"", b'"a string"', b"null", b'{"ts": 1', b"\xff\xfe", "[]"]
)
def test_non_objects_are_malformed_json(raw: bytes | str) -> None:
    with pytest.raises(MalformedJSON) as err:
        NVML_SAMPLES.decode(raw)
    assert err.value.field == "$"
    assert isinstance(err.value, SchemaError)
    assert isinstance(err.value, ValueError)


def test_schema_error_carries_its_parts_and_pickles() -> None:
    error = UnknownSchemaVersion("gpuwatch.alert/v1", "$.schema", "unknown major version")
    copied = pickle.loads(pickle.dumps(error))
    assert type(copied) is UnknownSchemaVersion
    assert (copied.schema, copied.field, copied.reason) == (error.schema, "$.schema", error.reason)
    assert str(copied) == "gpuwatch.alert/v1: $.schema: unknown major version"


def test_library_error_is_chained() -> None:
    with pytest.raises(SchemaError) as err:
        NVML_SAMPLES.decode(b'{"schema": "gpuwatch.nvml.sample/v1", "ts": -1}')
    assert err.value.__cause__ is not None
    assert err.value.field == "$.ts"
    assert err.value.reason == "Expected `int` >= 0"


def test_integral_float_is_not_an_integer_for_the_codec() -> None:
    # The one known disagreement: JSON Schema 2020-12 accepts 1.0 as an integer.
    message = example("gpuwatch.nvml.sample/v1") | {"ts": 1764412345000.0}
    with pytest.raises(SchemaError, match=r"\$\.ts: Expected `int`, got `float`"):
        NVML_SAMPLES.decode(_raw(message))


def test_str_input_decodes_like_bytes() -> None:
    text = json.dumps(EXAMPLES["gpuwatch.k8s.pod/v1"])
    assert K8S_PODS.decode(text) == K8S_PODS.decode(text.encode())
