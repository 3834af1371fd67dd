"""The local stack's Prometheus runs our configuration and answers queries."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from gpuwatch.harness.stack.prometheus import moved
from schemas.settings import Settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def test_prometheus_scrapes_itself_and_has_our_jobs(stack: Settings) -> None:
    base = f"http://127.0.0.1:{stack.stack.prometheus_port}"
    with urllib.request.urlopen(f"{base}/-/ready", timeout=10) as response:
        assert response.status == 200

    targets = _get(f"{base}/api/v1/targets")["data"]["activeTargets"]
    jobs = {target["labels"]["job"] for target in targets}
    assert {"gpuwatch-worker", "gpuwatch-node-agent", "prometheus"} <= jobs

    # The first scrape of itself lands within a scrape interval of start.
    result: list[Any] = wait_until(
        lambda: _get(f"{base}/api/v1/query?query=up%7Bjob%3D%22prometheus%22%7D")["data"]["result"],
        timeout_s=30,
        what="Prometheus to scrape itself",
        interval_s=0.5,
    )
    assert result[0]["value"][1] == "1"


def _promtool_check(config: Path) -> str:
    checked = subprocess.run(
        ["promtool", "check", "config", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return checked.stdout


def test_promtool_accepts_the_config() -> None:
    assert _rules_found(_promtool_check(REPO / "deploy" / "prometheus" / "prometheus.yml"))


def _rules_found(output: str) -> list[str]:
    return [line for line in output.splitlines() if "rules found" in line]


def test_promtool_accepts_the_config_moved_to_another_port(tmp_path: Path) -> None:
    original = REPO / "deploy" / "prometheus" / "prometheus.yml"
    config = tmp_path / "prometheus.yml"
    config.write_text(moved(original, 19090))
    found = [line for line in _promtool_check(config).splitlines() if "rules found" in line]
    assert found  # the rule files are found from the copy's place too
    assert found == [
        line for line in _promtool_check(original).splitlines() if "rules found" in line
    ]
