"""`gpuwatch k8s-watcher` run as a user runs it, for the tests of this folder: started on a
kubeconfig with the test's topics, its /metrics scraped, its closing line read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from schemas.settings import Settings

GPUWATCH = Path(sys.executable).with_name("gpuwatch")
STOPPED = re.compile(
    r"k8s watcher stopped events=\d+ published=(\d+) relists=(\d+) api_errors=0 "
    r"sent=(\d+) dropped=0"
)


def start(kubeconfig: Path, scoped: Settings, metrics_port: int) -> subprocess.Popen[str]:
    """The command on namespace ml, label `team` kept, for two minutes at most."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GPUWATCH_", "KUBERNETES_"))},
        "GPUWATCH_TOPIC_PREFIX": scoped.kafka.topic_prefix,
        "GPUWATCH_KAFKA_BOOTSTRAP": scoped.kafka.bootstrap,
    }
    command = [str(GPUWATCH), "k8s-watcher", "--kubeconfig", str(kubeconfig)]
    command += ["--namespace", "ml", "--label", "team", "--metrics-port", str(metrics_port)]
    command += ["--duration", "120"]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def scrape(port: int) -> str:
    """The command's /metrics; empty while it does not serve yet."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return bytes(response.read()).decode()
    except OSError:
        return ""


def stopped(stderr: str) -> tuple[str, ...]:
    """(published, relists, sent) of the command's closing line."""
    found = STOPPED.search(stderr)
    assert found is not None, stderr
    return found.groups()
