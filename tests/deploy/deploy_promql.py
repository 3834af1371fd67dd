"""Reads the metric names and label names a PromQL expression uses, and checks its syntax.

Not a PromQL parser: a tokenizer good enough for the expressions of our dashboards and
rules. Strings are blanked, `{...}` selectors and `by/on/...(...)` clauses are read for
label names, and the identifiers left that are not functions or keywords are metric names.
Syntax is checked by promtool (`promtool check rules` on the expressions as recording
rules), which parses with Prometheus' own parser.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

# Grafana's variables in a query, replaced by something PromQL accepts.
GRAFANA_DURATIONS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right"}
    | {"bool", "offset", "inf", "nan"}
)
# Series Prometheus makes itself: scrape health and the state of its alert rules.
PROMETHEUS_OWN = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
# Labels Prometheus adds to every scraped series; ALERTS carries the rules' labels too.
TARGET_LABELS = frozenset({"job", "instance"})
ALERT_LABELS = frozenset({"alertname", "alertstate", "severity"})

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)?\s*\{([^{}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
_CLAUSE = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^()]*)\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(?![A-Za-z0-9_:])(\s*\()?")
_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_RANGE = re.compile(r"\[[^\]]*\]")


@dataclass
class Uses:
    """What one expression refers to."""

    metrics: set[str] = field(default_factory=set)
    selector_labels: dict[str, set[str]] = field(default_factory=dict)
    """Metric name ("" for a bare `{...}`) -> label names in its matchers."""
    clause_labels: set[str] = field(default_factory=set)
    """Label names in by/without/on/ignoring/group_left/group_right."""


def substitute(expr: str) -> str:
    """The expression with Grafana's variables replaced: durations, then `$var` as `x`."""
    for name, value in GRAFANA_DURATIONS.items():
        expr = expr.replace(name, value)
    return _VARIABLE.sub("x", expr)


def uses(expr: str) -> Uses:
    """The metric names and label names of a PromQL expression."""
    text = _STRING.sub('""', substitute(expr))
    text = _RANGE.sub("", text)
    found = Uses()
    for match in _SELECTOR.finditer(text):
        name = match.group(1) or ""
        labels = set(_MATCHER.findall(match.group(2)))
        found.selector_labels.setdefault(name, set()).update(labels)
    text = _SELECTOR.sub(lambda m: f" {m.group(1) or ''} ", text)
    for match in _CLAUSE.finditer(text):
        found.clause_labels.update(
            label.strip() for label in match.group(2).split(",") if label.strip()
        )
    text = _CLAUSE.sub(" ", text)
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        found.metrics.add(name)
    found.metrics.update(name for name in found.selector_labels if name)
    return found


def problems(expr: str, exported: Mapping[str, frozenset[str]]) -> list[str]:
    """What in `expr` names a metric or label that nothing exports ([] when all is known)."""
    found = uses(expr)
    errors = [
        f"unknown metric {name}"
        for name in sorted(found.metrics)
        if name not in exported and name not in PROMETHEUS_OWN
    ]
    if not found.metrics:
        errors.append("no metric")
    if found.metrics & {"ALERTS", "ALERTS_FOR_STATE"}:
        return errors  # alert series carry the labels of whichever rule fired
    known = set(TARGET_LABELS)
    for name in found.metrics:
        known |= exported.get(name, frozenset())
    for name, labels in found.selector_labels.items():
        carried = exported.get(name, frozenset()) | TARGET_LABELS if name else known
        errors += [f"{name} has no label {label}" for label in sorted(labels - carried)]
    errors += [f"no metric here has label {label}" for label in sorted(found.clause_labels - known)]
    return errors


def legend_problems(legend: str, expr: str, exported: Mapping[str, frozenset[str]]) -> list[str]:
    """Labels a `{{label}}` legend shows that no metric of the expression carries."""
    if "ALERTS" in uses(expr).metrics:
        return []
    known = set(TARGET_LABELS)
    for name in uses(expr).metrics:
        known |= exported.get(name, frozenset())
    shown = re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend)
    return [
        f"legend shows {label}, absent from the series" for label in shown if label not in known
    ]


def promtool_check(exprs: Iterable[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on the expressions written as recording rules."""
    rules = [
        {"record": f"gpuwatch_dashboard_check_{i}", "expr": substitute(expr)}
        for i, expr in enumerate(exprs)
    ]
    path = workdir / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}), "utf-8")
    return subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
