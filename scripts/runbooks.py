"""Writes docs/runbooks.md, the page of every alert's runbook, from the alert rules.

The rules (deploy/prometheus/gpuwatch-rules.yml and gpuwatch-threshold-rules.yml) stay the
one source of each runbook: their `runbook` annotation travels with every alert. This page
gathers them under a heading per alert so that a link has somewhere to point: the Helm
chart's runbook_url (prometheusRule.runbookBaseUrl) is `<page>#<alert name in lower
case>`, the anchor GitHub and GitLab give a heading made of the alert's name.

    python scripts/runbooks.py           # rewrite docs/runbooks.md
    python scripts/runbooks.py --check   # exit 1 when the page is not what the rules say
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
RULE_FILES = {
    "stream": ROOT / "deploy" / "prometheus" / "gpuwatch-rules.yml",
    "thresholds": ROOT / "deploy" / "prometheus" / "gpuwatch-threshold-rules.yml",
}
PAGE = ROOT / "docs" / "runbooks.md"

HEADER = """\
# Alert runbooks

<!-- Written by scripts/runbooks.py from the runbook annotations of
deploy/prometheus/gpuwatch-rules.yml and gpuwatch-threshold-rules.yml: edit the rules and
run it again (a test fails while this page and the rules differ). -->

What to do when a gpuwatch alert fires. Every alert has the same name in both rule sets
(`gpuwatch-rules.yml`, the stream's alerts, and `gpuwatch-threshold-rules.yml`, the same
alerts recomputed from the metrics); where their runbooks differ, both are given. Each
alert also carries its runbook in its `runbook` annotation. The Helm chart links every
alert here with `prometheusRule.runbookBaseUrl` set to this page's URL: the annotation
`runbook_url` is `<page>#<alert name in lower case>`.
"""


def alerts(path: Path) -> dict[str, dict[str, Any]]:
    """Alert name -> its rule and the name of its group, in the file's order."""
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    return {
        rule["alert"]: rule | {"group": group["name"]}
        for group in loaded["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def severity(rules: list[dict[str, Any]]) -> str:
    found = {rule.get("labels", {}).get("severity") for rule in rules}
    if found == {None}:
        return "per alert, from its series (the rule sets none)"
    return " or ".join(sorted(str(s) for s in found))


def runbook_block(runbook: str) -> list[str]:
    # A code block keeps the steps as the annotation has them: their `<pod>` placeholders
    # would otherwise be read as HTML and vanish.
    return ["```text", runbook.rstrip("\n"), "```"]


def render() -> str:
    sets = {name: alerts(path) for name, path in RULE_FILES.items()}
    names = list(dict.fromkeys(name for rules in sets.values() for name in rules))
    lines = [HEADER]
    lines += ["| alert | severity | rule groups |", "|---|---|---|"]
    for name in names:
        found = [alerts_of[name] for alerts_of in sets.values() if name in alerts_of]
        groups = ", ".join(dict.fromkeys(rule["group"] for rule in found))
        lines.append(f"| [{name}](#{name.lower()}) | {severity(found)} | {groups} |")
    for name in names:
        lines += ["", f"## {name}", ""]
        by_set = {label: alerts_of[name] for label, alerts_of in sets.items() if name in alerts_of}
        lines.append(f"Severity: {severity(list(by_set.values()))}.")
        runbooks = {label: rule["annotations"]["runbook"] for label, rule in by_set.items()}
        if len(set(runbooks.values())) == 1:
            lines += ["", *runbook_block(next(iter(runbooks.values())))]
            continue
        for label, runbook in runbooks.items():
            lines += ["", f"With `{RULE_FILES[label].name}`:", "", *runbook_block(runbook)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare, write nothing")
    args = parser.parse_args(argv)
    page = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != page:
            print(
                f"{PAGE.relative_to(ROOT)} is out of date: run scripts/runbooks.py", file=sys.stderr
            )
            return 1
        return 0
    PAGE.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
