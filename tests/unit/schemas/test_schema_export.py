"""The committed JSON Schema files are exactly what the types generate, and are sound schemas."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from schemas import ALL_TOPICS, TopicSpec
from schemas.export import JSON_DIR, json_schema, main, render, stale_files
from schemas.fields import DEFAULT_CLUSTER


def test_committed_files_equal_generated_ones() -> None:
    assert stale_files(JSON_DIR) == [], "run: python -m schemas.export"
    assert sorted(p.name for p in JSON_DIR.glob("*.json")) == sorted(
        s.json_schema_file for s in ALL_TOPICS
    )


def test_check_mode_of_the_command_passes_on_the_tree() -> None:
    root = JSON_DIR.parent.parent
    done = subprocess.run(
        [sys.executable, "-m", "schemas.export", "--check"],
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


def test_check_lists_changed_missing_and_unknown_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--dir", str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("*.json"))) == len(ALL_TOPICS)
    assert main(["--check", "--dir", str(tmp_path)]) == 0
    changed = tmp_path / "gpuwatch.alert.v1.json"
    changed.write_text(changed.read_text().replace('"firing"', '"burning"'))
    missing = tmp_path / "gpuwatch.deadletter.v1.json"
    missing.unlink()
    unknown = tmp_path / "gpuwatch.alert.v0.json"
    unknown.write_text("{}\n")
    capsys.readouterr()
    assert main(["--check", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    for path in (changed, missing, unknown):
        assert f"out of date: {path}" in err
    assert "gpuwatch.nvml.sample.v1.json" not in err
    assert main(["--dir", str(tmp_path)]) == 0  # rewrites the changed and missing ones
    assert stale_files(tmp_path) == [unknown]


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_generated_schema_is_a_sound_2020_12_schema(spec: TopicSpec[Any]) -> None:
    document = json_schema(spec)
    Draft202012Validator.check_schema(document)
    assert document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert document["title"] == spec.schema_name
    assert document["$id"].endswith(spec.schema_name)
    text = render(spec)
    assert text.endswith("}\n")
    assert text == render(spec)
    assert json.loads(text) == document


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_every_value_requires_its_schema_name_and_an_integer_ts(spec: TopicSpec[Any]) -> None:
    document = json_schema(spec)
    assert {"schema", "ts"} <= set(document["required"])
    assert document["properties"]["schema"] == {"enum": [spec.schema_name]}
    assert document["properties"]["ts"]["type"] == "integer"
    assert document["properties"]["ts"]["minimum"] == 0


HEALTH = {"throttle_reasons", "remapped_rows", "retired_pages_pending", "pcie_replays"}
WORK = {
    "work": "gpuwatch.nvml.sample/v1",
    "units": "gpuwatch.pod.usage/v1",
    "work_units": "gpuwatch.attribution/v1",
    "cost_per_unit": "gpuwatch.attribution/v1",
}
REVISED = {"gpuwatch.attribution/v1", "gpuwatch.gpu.window/v1"}
UNSEEN_DELETIONS = {"gpuwatch.k8s.pod/v1", "gpuwatch.k8s.workload/v1"}
"""The watched objects a relist can find deleted unseen (`final_state_unknown`)."""


@pytest.mark.parametrize("spec", ALL_TOPICS, ids=lambda s: s.name)
def test_every_object_is_documented_and_all_fields_required(spec: TopicSpec[Any]) -> None:
    document = json_schema(spec)
    for obj in [document, *document.get("$defs", {}).values()]:
        assert obj["description"].strip(), obj["title"]
        # Present-but-null is how "unknown" is said; the optional fields are those added
        # within v1: `cluster`, whose absence means the default cluster, a GPU's health
        # readings, a pod's GPU models and an allocation's claim, whose absence means null,
        # the units of work, whose absence means none, a window's revision, whose
        # absence means the first copy, and a pod's or a workload's final_state_unknown,
        # whose absence means false.
        optional = set(obj["properties"]) - set(obj["required"])
        assert optional <= {
            "cluster", "gpu_products", "claim", "controller_uid", "scheduling_gates", *HEALTH,
            *WORK, "revision", "final_state_unknown",
        }, obj["title"]  # fmt: skip
        if "final_state_unknown" in optional:
            assert obj["title"] in UNSEEN_DELETIONS, obj["title"]
            assert obj["properties"]["final_state_unknown"]["default"] is False
        if "revision" in optional:
            assert obj["title"] in REVISED, obj["title"]
            assert obj["properties"]["revision"]["default"] == 0
        for name in optional & set(WORK):
            assert obj["title"] == WORK[name], name
            assert obj["properties"][name]["default"] in ({}, []), name
        if "claim" in optional:
            assert obj["title"] == "Allocation"
            assert obj["properties"]["claim"]["default"] is None
        if "cluster" in optional:
            assert obj["properties"]["cluster"]["default"] == DEFAULT_CLUSTER
        for name in optional & HEALTH:
            assert obj["title"] == "GpuReading", name
            assert obj["properties"][name]["default"] is None, name
        for name in optional & {"gpu_products", "controller_uid", "scheduling_gates"}:
            assert obj["title"] == "gpuwatch.k8s.pod/v1", name
            assert obj["properties"][name]["default"] is None, name
