"""values.schema.json: the values helm accepts before it renders anything.

The defaults and every ci/ values file pass it (helm lint --strict, helm template, and
jsonschema on its own); wrong values are refused with the field named; its enums and
patterns are the product's own (the command line's choices, the settings' literals, the
messages' cluster rule), so the chart cannot accept what a process would refuse.
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Any, get_args

import jsonschema
import msgspec
import pytest
import yaml
from deploy_chart import CHART, CI_VALUES, helm_path, template
from support import run_command

from gpuwatch.cli import build_parser
from schemas.fields import Cluster
from schemas.settings import KafkaSettings

SCHEMA = CHART / "values.schema.json"
VALUES = CHART / "values.yaml"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def helm() -> str:
    return helm_path()


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return loaded


def defaults() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(VALUES.read_text(encoding="utf-8"))
    return loaded


def coalesced(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` over `base` as helm merges a values file: maps merged, a null deletes."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = coalesced(merged[key], value)
        else:
            merged[key] = value
    return merged


def without_nulls(values: Any) -> Any:
    """What helm validates: the keys whose value is null are gone."""
    if isinstance(values, dict):
        return {k: without_nulls(v) for k, v in values.items() if v is not None}
    return values


# --- the schema itself ------------------------------------------------------------------------


def test_the_schema_is_draft_07_and_names_every_section_of_values_yaml() -> None:
    loaded = schema()
    assert loaded["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(loaded)
    # The top level accepts keys it does not list (a section added later renders), so each
    # section values.yaml has must be listed to be checked at all.
    assert set(defaults()) <= set(loaded["properties"])
    assert loaded["required"] == ["image"]
    assert loaded["properties"]["image"]["required"] == ["repository"]


def closed_sections(node: dict[str, Any], path: str = "") -> dict[str, dict[str, Any]]:
    """Path -> object schema, for every object schema that refuses unknown keys."""
    found = {}
    if node.get("additionalProperties") is False:
        found[path] = node
    for name, child in node.get("properties", {}).items():
        found |= closed_sections(child, f"{path}.{name}".lstrip("."))
    return found


def test_the_sections_it_closes_list_every_key_values_yaml_has() -> None:
    closed = closed_sections(schema())
    assert {"image", "worker", "sinkRedis", "nodeAgent", "prometheusRule", "helmTest",
            "serviceMonitor", "grafana.dashboards", "cluster"} <= set(closed)  # fmt: skip
    assert not {"", "kafka", "redis", "networkPolicy"} & set(closed)  # open: see its description
    values = defaults()
    for path, node in closed.items():
        section = values
        for part in path.split("."):
            section = section[part]
        assert set(section) <= set(node["properties"]), path


def test_its_enums_and_patterns_are_the_products() -> None:
    properties = schema()["properties"]
    parser = build_parser()
    (log_level,) = [a for a in parser._actions if a.dest == "log_level"]
    assert properties["logLevel"]["enum"] == list(log_level.choices or ())
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    agent = subparsers.choices["node-agent"]
    (backend,) = [a for a in agent._actions if a.dest == "backend"]
    assert properties["nodeAgent"]["properties"]["backend"]["enum"] == list(backend.choices or ())
    mechanism = KafkaSettings.model_fields["sasl_mechanism"].annotation
    (literal, _) = get_args(mechanism)
    sasl = properties["kafka"]["properties"]["sasl"]["properties"]["mechanism"]
    assert sasl["enum"] == list(get_args(literal))
    (meta,) = [m for m in get_args(Cluster)[1:] if isinstance(m, msgspec.Meta)]
    name = properties["cluster"]["properties"]["name"]
    assert (name["pattern"], name["maxLength"]) == (meta.pattern, meta.max_length)
    alerts_from = properties["prometheusRule"]["properties"]["alertsFrom"]["enum"]
    assert alerts_from == ["stream", "thresholds"]


# --- what passes ----------------------------------------------------------------------------------

CI_IDS = [path.stem for path in CI_VALUES]


def test_values_yaml_passes_the_schema_on_its_own() -> None:
    jsonschema.validate(without_nulls(defaults()), schema(), cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("values", CI_VALUES, ids=CI_IDS)
def test_every_ci_values_file_passes_the_schema_on_its_own(values: Any) -> None:
    override = yaml.safe_load(values.read_text(encoding="utf-8"))
    merged = without_nulls(coalesced(defaults(), override))
    jsonschema.validate(merged, schema(), cls=jsonschema.Draft7Validator)


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=["defaults", *CI_IDS])
def test_helm_lint_strict_and_template_pass(helm: str, values: Any) -> None:
    args = () if values is None else ("-f", str(values))
    done = run_command([helm, "lint", "--strict", str(CHART), *args], timeout_s=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout
    rendered = template(helm, *args)
    assert rendered.returncode == 0, rendered.stderr


# --- what is refused ---------------------------------------------------------------------------

WRONG = [
    (["--set-string", "worker.replicas=two"], "/worker/replicas", "got string, want integer"),
    (["--set", "logLevel=LOUD"], "/logLevel", "value must be one of"),
    (["--set", "nodeAgent.backend=gpu"], "/nodeAgent/backend",
     "value must be one of 'nvml', 'sim'"),
    (["--set", "cluster.name=eu west"], "/cluster/name", "does not match pattern"),
    (["--set", "cluster.name=" + "x" * 64], "/cluster/name", "maxLength: got 64, want 63"),
    (["--set", "prometheusRule.alertsFrom=metrics"], "/prometheusRule/alertsFrom",
     "value must be one of 'stream', 'thresholds'"),
    (["--set", "kafka.sasl.mechanism=GSSAPI"], "/kafka/sasl/mechanism", "value must be one of"),
    (["--set", "image.repository="], "/image/repository", "minLength: got 0, want 1"),
    (["--set", "worker.metricsPort=0"], "/worker/metricsPort", "minimum: got 0, want 1"),
    (["--set", "sinkMetrics.replicas=0"], "/sinkMetrics/replicas", "minimum: got 0, want 1"),
    (["--set", "worker.replcas=3"], "/worker", "additional properties 'replcas' not allowed"),
    (["--set", "serviceMonitor.interval=15"], "/serviceMonitor/interval",
     "got number, want string"),
    (["--set", "prometheusRule.additionalLabels.bad-name=x"], "/prometheusRule/additionalLabels",
     "additional properties 'bad-name' not allowed"),
]  # fmt: skip
WRONG_IDS = [
    "replicas", "log-level", "backend", "cluster-name", "cluster-length", "alerts-from", "sasl",
    "repository", "port", "sink-replicas", "misspelt", "interval", "label",
]  # fmt: skip


@pytest.mark.parametrize(("setting", "field", "why"), WRONG, ids=WRONG_IDS)
def test_helm_refuses_wrong_values_naming_the_field(
    helm: str, setting: list[str], field: str, why: str
) -> None:
    done = template(helm, *setting)
    assert done.returncode == 1
    assert "values don't meet the specifications of the schema" in done.stderr
    line = next(line for line in done.stderr.splitlines() if f"at '{field}'" in line)
    assert why in line, done.stderr


def test_helm_lint_refuses_a_wrong_values_file(helm: str, tmp_path: Any) -> None:
    values = tmp_path / "wrong.yaml"
    values.write_text("worker:\n  replicas: two\nlogLevel: LOUD\n", encoding="utf-8")
    done = run_command([helm, "lint", "--strict", str(CHART), "-f", str(values)], timeout_s=120)
    assert done.returncode != 0
    assert "at '/worker/replicas'" in done.stdout + done.stderr
    assert "at '/logLevel'" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("override", "path"),
    [
        ({"worker": {"replicas": "two"}}, ["worker", "replicas"]),
        ({"logLevel": "LOUD"}, ["logLevel"]),
        ({"nodeAgent": {"backend": "gpu"}}, ["nodeAgent", "backend"]),
        ({"cluster": {"name": "eu west"}}, ["cluster", "name"]),
    ],
    ids=["replicas", "log-level", "backend", "cluster-name"],
)
def test_jsonschema_refuses_the_same_values(override: dict[str, Any], path: list[str]) -> None:
    validator = jsonschema.Draft7Validator(schema())
    errors = list(validator.iter_errors(without_nulls(coalesced(defaults(), override))))
    assert [list(error.absolute_path) for error in errors] == [path]
