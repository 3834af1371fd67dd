"""scripts/helm.sh: builds helm once into the cache, reuses it, cleans up, says when it can't.

A stand-in `go` that writes a shell script as the "helm" binary keeps this fast; the real
build is exercised by the chart tests (tests/deploy/test_deploy_helm.py), which run it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "helm.sh"

FAKE_GO = """#!/usr/bin/env bash
# Records its arguments and environment, then "installs" a helm that echoes its own.
echo "$@" >> "$FAKE_GO_LOG"
if [ "$1" = version ]; then echo "go version go1.99 linux/amd64"; exit 0; fi
echo "GOMODCACHE=$GOMODCACHE GOCACHE=$GOCACHE" >> "$FAKE_GO_LOG"
mkdir -p "$GOMODCACHE/x" && touch "$GOMODCACHE/x/mod.go" && chmod -R a-w "$GOMODCACHE/x"
mkdir -p "$GOBIN"
printf '#!/bin/sh\\necho fake-helm "$@"\\n' > "$GOBIN/helm"
chmod +x "$GOBIN/helm"
"""


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def environment(tmp_path: Path, go: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    return keep | {
        "GPUWATCH_CACHE_DIR": str(tmp_path / "cache"),
        "GPUWATCH_GO": str(go),
        "FAKE_GO_LOG": str(tmp_path / "go.log"),
        "TMPDIR": str(tmp_path / "tmp"),
    }


def test_builds_once_with_the_pinned_version_and_removes_its_build_files(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text(FAKE_GO, encoding="utf-8")
    go.chmod(0o755)
    env = environment(tmp_path, go)

    first = run(env, "--path")
    assert first.returncode == 0, first.stderr
    binary = tmp_path / "cache" / "helm" / "v3.19.0" / "helm"
    assert first.stdout.strip() == str(binary)
    assert "building helm v3.19.0 with go1.99" in first.stderr
    log = (tmp_path / "go.log").read_text(encoding="utf-8").splitlines()
    assert log[0] == "version"  # for the progress message
    log = log[1:]
    assert log[0].startswith("install -ldflags")
    assert log[0].endswith("helm.sh/helm/v3/cmd/helm@v3.19.0")
    assert "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34" in log[0]
    assert "internal/version.version=v3.19.0" in log[0]
    # The module and build caches were in the temporary directory, which is gone.
    assert f"GOMODCACHE={tmp_path / 'tmp'}" in log[1]
    assert list((tmp_path / "tmp").iterdir()) == []

    again = run(env, "template", "x", "chart")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "fake-helm template x chart"
    calls = (tmp_path / "go.log").read_text(encoding="utf-8").splitlines()
    assert len(calls) == 3  # version, install and its environment: no second build


def test_an_installed_helm_is_used_as_it_is(tmp_path: Path) -> None:
    env = environment(tmp_path, tmp_path / "no-go") | {"GPUWATCH_HELM": "/usr/bin/true"}
    done = run(env, "--path")
    assert (done.returncode, done.stdout.strip()) == (0, "/usr/bin/true")


def test_a_failed_build_fails_and_caches_nothing(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text("#!/bin/sh\necho 'go: module lookup disabled' >&2\nexit 1\n", encoding="utf-8")
    go.chmod(0o755)
    done = run(environment(tmp_path, go), "version")
    assert done.returncode == 1
    assert "module lookup disabled" in done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "cache" / "helm" / "v3.19.0" / "helm").exists()


def test_without_helm_or_go_it_says_so_and_exits_3(tmp_path: Path) -> None:
    done = run(environment(tmp_path, tmp_path / "no-go"), "version")
    assert done.returncode == 3
    assert "no Go toolchain" in done.stderr
    assert not (tmp_path / "cache" / "helm" / "v3.19.0" / "helm").exists()
