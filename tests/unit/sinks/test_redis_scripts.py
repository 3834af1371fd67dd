"""The Redis sink's Lua scripts are files of `sinks.redis`: one per script name, each loaded,
and pyproject's package-data globs take every one, so a wheel (and the image) has them."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import get_args

from setuptools import find_packages

import sinks.redis
from sinks.redis.plan import ScriptName
from sinks.redis.sink import _SHAS, SCRIPTS

ROOT = Path(__file__).resolve().parents[3]
PACKAGE = Path(sinks.redis.__file__).resolve().parent
LUA = PACKAGE / "lua"


def test_every_script_name_has_its_file_and_every_file_is_a_script() -> None:
    names = set(get_args(ScriptName))
    assert len(names) == 10
    assert {path.stem for path in LUA.iterdir() if path.is_file()} == names
    assert {path.suffix for path in LUA.iterdir()} == {".lua"}


def test_every_script_is_loaded_from_its_file() -> None:
    assert set(SCRIPTS) == set(get_args(ScriptName))
    for name, source in SCRIPTS.items():
        assert source == (LUA / f"{name}.lua").read_text(encoding="utf-8")
        assert "redis.call(" in source, name
        assert "\nreturn " in source, name
        assert _SHAS[name] == hashlib.sha1(source.encode()).hexdigest()


def test_the_package_data_globs_take_every_script_file() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    include = tool["setuptools"]["packages"]["find"]["include"]
    assert "sinks.redis" in find_packages(where=str(ROOT), include=include)
    # setuptools resolves package-data globs relative to the package's directory.
    globs = tool["setuptools"]["package-data"].get("sinks.redis", [])
    taken = {path for pattern in globs for path in PACKAGE.glob(pattern) if path.is_file()}
    assert taken == set(LUA.iterdir())
    assert len(taken) == len(get_args(ScriptName))
