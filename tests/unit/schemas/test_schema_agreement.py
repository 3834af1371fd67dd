"""The Python types (codec) and the published JSON Schemas accept and reject the same messages."""

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpuwatch.harness.examples import EXAMPLES
from schemas import ALL_TOPICS, SchemaError, TopicSpec, WrongSchema
from schemas.export import JSON_DIR

SPECS: dict[str, TopicSpec[Any]] = {spec.schema_name: spec for spec in ALL_TOPICS}


def _validator(spec: TopicSpec[Any]) -> Draft202012Validator:
    """A validator of the committed schema file (format checking is off by default)."""
    document = json.loads(Path(JSON_DIR, spec.json_schema_file).read_text(encoding="utf-8"))
    return Draft202012Validator(document)


VALIDATORS = {name: _validator(spec) for name, spec in SPECS.items()}


def _json_locations(schema_name: str, message: Any) -> set[str]:
    """Where jsonschema finds errors (inside `anyOf` too), as `$.a[0].b`, a missing field last."""
    locations = set()
    errors = list(VALIDATORS[schema_name].iter_errors(message))
    while errors:
        error = errors.pop()
        errors.extend(error.context or ())
        steps = error.absolute_path
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in steps)
        if error.validator == "required":
            path += "." + error.message.split("'")[1]
        locations.add(path)
    return locations


def _decode(schema_name: str, message: Any) -> object:
    return SPECS[schema_name].decode(json.dumps(message).encode())


# --- a walk over the schema next to the example ----------------------------------------------


def _resolve(sub: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in sub:
        sub = root["$defs"][sub["$ref"].rpartition("/")[2]]
    return sub


def _branches(sub: dict[str, Any], root: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a property schema, resolved (one unless it is `anyOf`)."""
    sub = _resolve(sub, root)
    return [_resolve(b, root) for b in sub["anyOf"]] if "anyOf" in sub else [sub]


def _types(branch: dict[str, Any]) -> set[str]:
    if "enum" in branch:
        return {{str: "string", int: "integer"}[type(v)] for v in branch["enum"]}
    return {branch["type"]}


# A value of another JSON type for each type. Never an integral float such as 1.0 for an
# integer: JSON Schema 2020-12 counts 1.0 as an integer, msgspec (rightly, for ids and
# epochs) does not, so that one disagreement is deliberate and not tested here.
WRONG = {
    "integer": "12345",
    "number": "12.5",
    "string": 12345,
    "boolean": "true",
    "array": {"not": "a list"},
    "object": ["not", "an", "object"],
}


@dataclass(frozen=True)
class Mutant:
    """A message with one field broken; `path` is where the codec must point (msgspec's
    notation: map values are `[...]`), `json_path` where jsonschema points."""

    schema_name: str
    what: str
    path: str
    message: dict[str, Any]
    json_path: str = ""

    @property
    def id(self) -> str:
        return f"{self.schema_name}:{self.path}:{self.what}"


def _set(message: dict[str, Any], steps: list[str | int], value: Any) -> dict[str, Any]:
    copied = copy.deepcopy(message)
    target: Any = copied
    for step in steps[:-1]:
        target = target[step]
    if value is _DELETE:
        del target[steps[-1]]
    else:
        target[steps[-1]] = value
    return copied


_DELETE = object()


def _fmt(steps: list[str | int]) -> str:
    return "$" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in steps)


def _fields(
    value: dict[str, Any], obj: dict[str, Any], root: dict[str, Any], steps: list[str | int]
) -> Iterator[tuple[list[str | int], dict[str, Any], Any]]:
    """Every required field of an object and of the objects nested in it (first list item)."""
    for name in obj["required"]:
        here = [*steps, name]
        yield here, obj["properties"][name], value[name]
        for branch in _branches(obj["properties"][name], root):
            if "properties" in branch and isinstance(value[name], dict):
                yield from _fields(value[name], branch, root, here)
            items = branch.get("items", {})
            if branch.get("type") == "array" and value[name]:
                item = _resolve(items, root)
                if "properties" in item:
                    yield from _fields(value[name][0], item, root, [*here, 0])


def _field_mutants(
    schema_name: str, steps: list[str | int], branch: dict[str, Any], current: Any
) -> Iterator[tuple[str, list[str | int], Any, str, str]]:
    """(what, steps to change, new value, codec path, jsonschema path) for one field."""
    path = _fmt(steps)
    kind = sorted(_types(branch))[0]
    yield "deleted", steps, _DELETE, path, path
    yield f"{kind} -> {type(WRONG[kind]).__name__}", steps, WRONG[kind], path, path
    if steps[-1] == "ts":
        yield "ts as a string", steps, "1764412345000", path, path
        yield "ts negative", steps, -1, path, path
    if "minimum" in branch:
        under = branch["minimum"] - (1 if kind == "integer" else 0.5)
        yield "under minimum", steps, under, path, path
    if "exclusiveMinimum" in branch:
        yield "at exclusive minimum", steps, branch["exclusiveMinimum"], path, path
    if "maximum" in branch:
        yield "over maximum", steps, branch["maximum"] + 1, path, path
    if "enum" in branch:
        yield "not in enum", steps, "NotAMember", path, path
    if kind == "object" and "additionalProperties" in branch and current:
        key = next(iter(current))
        wrong = WRONG[sorted(_types(branch["additionalProperties"]))[0]]
        # msgspec does not name the key of a bad map value, jsonschema does.
        yield "map value of wrong type", [*steps, key], wrong, f"{path}[...]", f"{path}.{key}"
    if kind == "array" and current and "type" in branch["items"]:
        wrong = WRONG[sorted(_types(branch["items"]))[0]]
        yield "list item of wrong type", [*steps, 0], wrong, f"{path}[0]", f"{path}[0]"


def mutants() -> Iterator[Mutant]:
    for schema_name, message in EXAMPLES.items():
        root = VALIDATORS[schema_name].schema
        for steps, prop, current in _fields(message, root, root, []):
            (branch,) = [b for b in _branches(prop, root) if b.get("type") != "null"]
            for what, where, value, path, json_path in _field_mutants(
                schema_name, steps, branch, current
            ):
                yield Mutant(schema_name, what, path, _set(message, where, value), json_path)


def _nullable_fields() -> Iterator[tuple[str, str, dict[str, Any]]]:
    for schema_name, message in EXAMPLES.items():
        root = VALIDATORS[schema_name].schema
        for steps, prop, current in _fields(message, root, root, []):
            if current is not None and {"type": "null"} in _branches(prop, root):
                yield schema_name, _fmt(steps), _set(message, steps, None)


MUTANTS = list(mutants())
NULLABLE = list(_nullable_fields())


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("schema_name", EXAMPLES)
def test_example_is_valid_json_schema_and_round_trips(schema_name: str) -> None:
    message = EXAMPLES[schema_name]
    assert list(VALIDATORS[schema_name].iter_errors(message)) == []
    spec = SPECS[schema_name]
    value = _decode(schema_name, message)
    assert isinstance(value, spec.value_type)
    encoded = spec.encode(value)
    assert json.loads(encoded) == message  # every field survives, nothing is added
    assert spec.decode(encoded) == value


def test_the_mutation_walk_covers_every_topic_and_nested_fields() -> None:
    paths = {m.path for m in MUTANTS}
    assert {m.schema_name for m in MUTANTS} == set(EXAMPLES)
    for nested in ("$.gpus[0].processes[0].pod_uid", "$.allocations[0].device_ids[0]"):
        assert nested in paths
    assert {"$.subject.kind", "$.owner.kind", "$.pods[0].share_mean", "$.labels[...]"} <= paths
    assert len(MUTANTS) > 500


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.id)
def test_mutant_is_rejected_by_both_at_the_same_field(mutant: Mutant) -> None:
    assert mutant.json_path in _json_locations(mutant.schema_name, mutant.message)
    with pytest.raises(SchemaError) as caught:
        _decode(mutant.schema_name, mutant.message)
    assert caught.value.field == mutant.path
    assert caught.value.schema == mutant.schema_name
    expected = WrongSchema if mutant.path == "$.schema" else SchemaError
    assert type(caught.value) is expected


@pytest.mark.parametrize(
    ("schema_name", "path", "message"),
    [pytest.param(*case, id=f"{case[0]}:{case[1]}") for case in NULLABLE],
)
def test_nullable_required_field_accepts_null(
    schema_name: str, path: str, message: dict[str, Any]
) -> None:
    assert list(VALIDATORS[schema_name].iter_errors(message)) == [], path
    _decode(schema_name, message)


def test_nullable_fields_include_unsupported_readings() -> None:
    nvml = {path for name, path, _ in NULLABLE if name == "gpuwatch.nvml.sample/v1"}
    for field in ("util_pct", "mem_util_pct", "power_w", "temp_c", "ecc_dbe"):
        assert f"$.gpus[0].{field}" in nvml
    assert {"$.gpus[0].processes[0].sm_pct", "$.gpus[0].processes[0].pod_uid"} <= nvml


def _objects(schema_name: str) -> Iterator[list[str | int]]:
    """Steps to the top level and to every nested object of an example."""
    message, root = EXAMPLES[schema_name], VALIDATORS[schema_name].schema
    yield []
    for steps, prop, current in _fields(message, root, root, []):
        if isinstance(current, dict) and any("properties" in b for b in _branches(prop, root)):
            yield steps
        elif isinstance(current, list) and current and isinstance(current[0], dict):
            yield [*steps, 0]


EXTENDED = [(name, steps) for name in EXAMPLES for steps in _objects(name)]


@pytest.mark.parametrize(("schema_name", "steps"), EXTENDED, ids=str)
def test_unknown_extra_field_is_accepted_by_both(schema_name: str, steps: list[str | int]) -> None:
    future = {"added_in_v1_7": {"any": ["shape", 1]}}
    target = _set(EXAMPLES[schema_name], [*steps, "added_in_v1_7"], future)
    assert list(VALIDATORS[schema_name].iter_errors(target)) == []
    value = _decode(schema_name, target)
    assert value == _decode(schema_name, EXAMPLES[schema_name])  # ignored, not kept


def test_nested_extension_points_are_exercised() -> None:
    nvml = [steps for name, steps in EXTENDED if name == "gpuwatch.nvml.sample/v1"]
    assert ["gpus", 0, "processes", 0] in nvml
    assert ["allocations", 0] in nvml
