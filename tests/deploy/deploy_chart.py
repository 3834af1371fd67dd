"""The Helm chart rendered for the tests of its rules, its test pod and its values schema:
the pinned helm and `helm template` (test hooks included, as `helm template` renders them).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import free_port, reaped, run_command, wait_until

from sinks.redis.client import RedisConnectionError, connect

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


@contextmanager
def redis_server(args: list[str], password: str = "") -> Iterator[int]:
    """A redis-server of the test alone with `args` (its --dir among them), on a port of its
    own on 127.0.0.1, answering (with `password`) before this yields its port; skipped where
    no redis-server is installed."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("no redis-server installed (scripts/os-deps.sh installs it)")
    port = free_port()
    argv = [binary, *args, "--port", str(port), "--bind", "127.0.0.1"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with reaped(process):
        auth = f":{password}@" if password else ""
        client = connect(f"redis://{auth}127.0.0.1:{port}/0", timeout_s=1, retries=0)
        try:
            wait_until(
                client.ping, timeout_s=20, what="redis-server", not_yet=(RedisConnectionError,)
            )
        finally:
            client.close()
        yield port
        process.terminate()
        process.communicate(timeout=10)
