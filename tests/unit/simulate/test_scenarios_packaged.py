"""The shipped scenarios are package data of `gpuwatch.harness.simulate`: pyproject's package-data
globs take every file of the scenarios directory, so a wheel (and the image) has them."""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages

import gpuwatch.harness.simulate
from gpuwatch.harness.simulate.scenario import SCENARIOS_DIR, scenario_names

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(gpuwatch.harness.simulate.__file__).resolve().parent


def test_the_scenarios_live_in_the_package_and_nowhere_else() -> None:
    assert SCENARIOS_DIR == PACKAGE / "scenarios"
    assert scenario_names() == ["dra", "fleet", "incident", "small"]
    assert not (ROOT / "scenarios").exists(), "a second copy at the top level"


def test_the_package_data_globs_take_every_scenario_file() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    found = find_packages(where=str(ROOT), include=setuptools["packages"]["find"]["include"])
    assert "gpuwatch.harness.simulate" in found
    globs = setuptools["package-data"].get("gpuwatch.harness.simulate", [])
    # setuptools resolves package-data globs relative to the package's directory.
    taken = {path for pattern in globs for path in PACKAGE.glob(pattern) if path.is_file()}
    shipped = {path for path in SCENARIOS_DIR.iterdir() if path.is_file()}
    assert {p.name for p in shipped} == {
        "README.md",
        "dra.yaml",
        "fleet.yaml",
        "incident.yaml",
        "small.yaml",
    }
    assert taken == shipped
