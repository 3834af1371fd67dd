"""docs/DESIGN.md stays true to the tree: the citations of it land on its sections, it names
every topic, Redis key and command, and every package says in a line what it holds."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from gpuwatch.cli.main import build_parser
from schemas.settings import Settings
from schemas.topics import ALL_TOPICS
from sinks.redis.keys import RedisKeys
from streams.faust.app import changelog_topic_names
from streams.faust.tick_timer import fleet_topic_name, tick_topic_name

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "DESIGN.md"
PACKAGES = ("schemas", "producers", "streams", "sinks", "gpuwatch")
SCANNED = (*PACKAGES, "docs", "deploy", "tests")
TEXT_SUFFIXES = frozenset({".py", ".md", ".yaml", ".yml", ".tpl", ".toml", ".json", ".sh"})

MENTION = re.compile(r"[\w./-]*\bDESIGN(?:\.md)?(?!\w)")
"""A mention of the design document: a path ending in DESIGN or DESIGN.md (not DESIGN_X)."""
SECTIONS_CITED = re.compile(r"(?:\s*(?:,|and|or)?\s*(?:§|section\s+)\s*\d+(?:\.\d+)*)+")
"""What follows a mention when it cites sections: ` §3`, ` §3.3 and §4`, ` section 5`."""
HEADING = re.compile(r"^#{2,4} (\d+(?:\.\d+)*)\.? ", re.MULTILINE)
NOT_KEYS = frozenset({"pattern"})  # a SCAN pattern of the prefix, not a key


class Citation(NamedTuple):
    where: str
    """file:line"""
    ok_path: bool
    """Whether the mention names docs/DESIGN.md (from the root, or relative to its file)."""
    sections: str
    """The text that cites sections after the mention ('' for none)."""


def _text_files() -> Iterator[Path]:
    """The files that may cite the design document: product code, docs, deploy, tests."""
    yield from sorted(ROOT.glob("*.md"))
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            parts = path.relative_to(ROOT).parts
            if "__pycache__" in parts or any(part.startswith(".") for part in parts):
                continue
            if path.suffix in TEXT_SUFFIXES and path.is_file() and path != Path(__file__).resolve():
                yield path


def _citations() -> Iterator[Citation]:
    for path in _text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for match in MENTION.finditer(text):
            named = match.group()
            ok = named.endswith("DESIGN.md") and DOC in {
                (ROOT / named).resolve(),
                (path.parent / named).resolve(),
            }
            cited = SECTIONS_CITED.match(text, match.end())
            line = text.count("\n", 0, match.start()) + 1
            where = f"{path.relative_to(ROOT)}:{line}"
            yield Citation(where, ok, cited.group() if cited else "")


def _sections() -> set[str]:
    return set(HEADING.findall(DOC.read_text(encoding="utf-8")))


def _doc() -> str:
    return DOC.read_text(encoding="utf-8")


def test_the_design_document_is_in_the_repository_and_the_readme_links_it() -> None:
    assert {"1", "2", "3", "3.1", "3.2", "3.3", "4", "5", "6", "7", "8"} <= _sections()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    top = readme.split("\n## ", 1)[0]
    assert "(docs/DESIGN.md)" in top  # a link from the README's first section


def test_every_citation_names_docs_design_md_and_a_section_it_has() -> None:
    sections = _sections()
    citations = list(_citations())
    assert len(citations) > 40  # the scan finds them (47 when this test was written)
    outside = [c.where for c in citations if not c.ok_path]
    assert outside == [], "cite docs/DESIGN.md, the design document in the repository"
    worded = [c.where for c in citations if "section" in c.sections]
    assert worded == [], "cite a section as §N"
    missing = [
        f"{c.where}: §{number}"
        for c in citations
        for number in re.findall(r"\d+(?:\.\d+)*", c.sections)
        if number not in sections
    ]
    assert missing == [], f"docs/DESIGN.md has the sections {sorted(sections)}"


def test_every_topic_and_its_schema_is_in_the_design_document() -> None:
    doc = _doc()
    missing = [
        name
        for spec in ALL_TOPICS
        for name in (f"`{spec.name}`", f"`{spec.schema_name}`")
        if name not in doc
    ]
    assert missing == []


def test_the_workers_internal_topics_are_in_the_design_document() -> None:
    settings = Settings()
    base = settings.kafka.topic_prefix + settings.kafka.app_id
    internal = (
        tick_topic_name(settings),
        fleet_topic_name(settings),
        *changelog_topic_names(settings),
    )
    assert all(name.startswith(base) for name in internal)
    doc = _doc()
    missing = [
        f"<prefix><app_id>{name.removeprefix(base)}"
        for name in internal
        if f"`<prefix><app_id>{name.removeprefix(base)}`" not in doc
    ]
    assert missing == []


def _key_patterns(keys: RedisKeys) -> dict[str, str]:
    """Each key method of `RedisKeys` called with `{parameter}` for each of its parameters."""
    patterns = {}
    for name, method in inspect.getmembers(keys, inspect.ismethod):
        if name.startswith("_") or name in NOT_KEYS or name.endswith("_prefix"):
            continue  # `*_prefix`: the start of the per-window keys, named whole
        signature = inspect.signature(method)
        if signature.return_annotation != "str":
            continue  # the tuples of several keys (`pod_keys`, `states`)
        patterns[name] = method(*(f"{{{p}}}" for p in signature.parameters))
    return patterns


def test_every_redis_key_is_in_the_design_document() -> None:
    patterns = _key_patterns(RedisKeys())
    assert patterns["pod"] == "gpuwatch:pod:{uid}"
    assert patterns["state"] == "gpuwatch:state:{state}"
    assert len(patterns) > 20
    doc = _doc()
    assert {name: key for name, key in patterns.items() if f"`{key}`" not in doc} == {}


def _verbs(parser: argparse.ArgumentParser, path: str = "gpuwatch") -> Iterator[str]:
    """`gpuwatch VERB [ACTION]` for every verb and action of the parser, leaves only."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        yield path
    for action in subparsers:
        for name, sub in action.choices.items():
            yield from _verbs(sub, f"{path} {name}")


def test_every_command_is_in_the_design_document() -> None:
    verbs = list(_verbs(build_parser()))
    assert "gpuwatch sink redis" in verbs
    assert "gpuwatch worker" in verbs
    doc = _doc()
    assert [verb for verb in verbs if f"`{verb}`" not in doc] == []


def test_every_package_says_in_a_line_what_it_holds() -> None:
    packages = sorted(
        {path.parent for top in PACKAGES for path in (ROOT / top).rglob("*.py")},
    )
    assert len(packages) > 20
    lacking = []
    for package in packages:
        init = package / "__init__.py"
        docstring = ast.get_docstring(ast.parse(init.read_text())) if init.is_file() else None
        if not docstring or not docstring.splitlines()[0].strip():
            lacking.append(str(init.relative_to(ROOT)))
    assert lacking == []
