"""The Helm chart rendered for the tests of its rules, its test pod and its values schema:
the pinned helm and `helm template` (test hooks included, as `helm template` renders them).
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import run_command

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gpuwatch"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
NAMESPACE = "gpuwatch-system"

Object = dict[str, Any]


def helm_path() -> str:
    """The pinned helm of scripts/helm.sh (built on first use, minutes); the test is
    skipped where neither helm nor a Go toolchain to build it is found."""
    done = run_command([str(ROOT / "scripts" / "helm.sh"), "--path"], timeout_s=880)
    if done.returncode == 3:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart as release "gw", the test hooks included."""
    return run_command(
        [helm, "template", "gw", str(CHART), "--namespace", NAMESPACE, *args], timeout_s=120
    )


def render(helm: str, *args: str) -> list[Object]:
    done = template(helm, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
