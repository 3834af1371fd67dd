"""Kubernetes label selectors (`team=vision,tier!=batch,gpu,!spot,env in (a,b)`) as predicates.

The test API server filters lists and watches with them as the real one does; the
watcher itself only passes the setting's string through.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

__all__ = ["Matcher", "parse_selector"]

Matcher = Callable[[Mapping[str, str]], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")
_EQ = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split(selector: str) -> list[str]:
    """Split on the commas that are not inside `( )`."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def _requirement(text: str) -> Matcher:
    if found := _SET.match(text):
        key = found["key"]
        values = {v.strip() for v in found["values"].split(",") if v.strip()}
        if found["op"] == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if found := _EQ.match(text):
        key, value = found["key"], found["value"] or ""
        if found["op"] == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if found := _EXISTS.match(text):
        key = found["key"]
        if found["neg"]:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise ValueError(f"unable to parse requirement: {text.strip()!r}")


def parse_selector(selector: str | None) -> Matcher:
    """A predicate over labels; every requirement must hold. ValueError when malformed."""
    requirements = [_requirement(part) for part in _split(selector or "")]
    return lambda labels: all(requirement(labels) for requirement in requirements)
