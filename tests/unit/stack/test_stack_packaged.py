"""The files the stack runs on are package data of `gpuwatch.harness.stack`: links in its
files/ to their one source in deploy/ and scripts/, taken by pyproject's package-data globs,
so that a wheel runs `gpuwatch stack` and `gpuwatch demo` outside a checkout."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

import gpuwatch.harness.stack
from gpuwatch.harness.stack import kube, prometheus

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(gpuwatch.harness.stack.__file__).resolve().parent
FILES = PACKAGE / "files"
SOURCES = {
    "prometheus.yml": ROOT / "deploy" / "prometheus" / "prometheus.yml",
    "gpuwatch-rules.yml": ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml",
    "kube-apiserver.sh": ROOT / "scripts" / "kube-apiserver.sh",
    "lib/go-build.sh": ROOT / "scripts" / "lib" / "go-build.sh",
}


def _packaged() -> dict[str, Path]:
    return {p.relative_to(FILES).as_posix(): p for p in FILES.rglob("*") if not p.is_dir()}


def test_each_file_is_a_link_to_its_one_source() -> None:
    packaged = _packaged()
    assert set(packaged) == set(SOURCES)
    for name, path in packaged.items():
        assert path.is_symlink(), f"{name}: a second copy instead of a link"
        assert path.resolve() == SOURCES[name].resolve(), name


def test_the_stack_runs_on_the_packaged_files() -> None:
    assert prometheus.default_config() == SOURCES["prometheus.yml"]
    assert kube.build_script() == SOURCES["kube-apiserver.sh"]
    # Prometheus resolves rule files beside its configuration; the script sources lib/.
    config = yaml.safe_load((FILES / "prometheus.yml").read_text(encoding="utf-8"))
    assert config["rule_files"]
    for rule in config["rule_files"]:
        assert (FILES / rule).is_file(), rule
    assert '. "$(dirname "$0")/lib/go-build.sh"' in SOURCES["kube-apiserver.sh"].read_text()


def test_the_package_data_globs_take_every_file() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]
    globs = setuptools["package-data"].get("gpuwatch.harness.stack", [])
    # setuptools resolves package-data globs relative to the package's directory.
    taken = {path for pattern in globs for path in PACKAGE.glob(pattern) if path.is_file()}
    assert taken == set(_packaged().values())
