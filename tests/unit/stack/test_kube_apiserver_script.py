"""scripts/kube-apiserver.sh: downloads k8s.io/kubernetes, points its staging replaces at
the published modules, builds once into the cache, cleans up, says when it can't.

A stand-in `go` keeps this fast: it serves a module folder with a go.mod as the real one
is published, and "builds" a shell script. The real build runs in `make test` (tools).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "kube-apiserver.sh"

GO_MOD = """module k8s.io/kubernetes

go 1.24.0

require (
	k8s.io/api v0.0.0
	k8s.io/client-go v0.0.0
)

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go => ./staging/src/k8s.io/client-go
	k8s.io/kube-aggregator => ./staging/src/k8s.io/kube-aggregator
)
"""

FAKE_GO = """#!/usr/bin/env bash
echo "$@" >> "$FAKE_GO_LOG"
case "$1" in
  version) echo "go version go1.99 linux/amd64" ;;
  mod)
    dir="$GOMODCACHE/k8s.io/kubernetes@${4#k8s.io/kubernetes@}"
    mkdir -p "$dir/vendor" "$dir/cmd/kube-apiserver"
    cp "$FAKE_GO_MOD" "$dir/go.mod"; touch "$dir/go.work"
    chmod -R a-w "$dir"
    printf '{\\n\\t"Path": "k8s.io/kubernetes",\\n\\t"Dir": "%s",\\n\\t"Sum": "h1:x"\\n}\\n' "$dir"
    ;;
  build)
    cp go.mod "$FAKE_GO_SEEN"
    ls >> "$FAKE_GO_SEEN.ls"
    out="${@: -2:1}"
    printf '#!/bin/sh\\necho fake-kube-apiserver "$@"\\n' > "$out"; chmod +x "$out"
    ;;
esac
"""


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def environment(tmp_path: Path, go: Path) -> dict[str, str]:
    (tmp_path / "tmp").mkdir(exist_ok=True)
    (tmp_path / "go.mod.in").write_text(GO_MOD, encoding="utf-8")
    keep = {k: v for k, v in os.environ.items() if not k.startswith("GPUWATCH_")}
    return keep | {
        "GPUWATCH_CACHE_DIR": str(tmp_path / "cache"),
        "GPUWATCH_GO": str(go),
        "FAKE_GO_LOG": str(tmp_path / "go.log"),
        "FAKE_GO_MOD": str(tmp_path / "go.mod.in"),
        "FAKE_GO_SEEN": str(tmp_path / "go.mod.seen"),
        "TMPDIR": str(tmp_path / "tmp"),
    }


def fake_go(tmp_path: Path) -> Path:
    go = tmp_path / "go"
    go.write_text(FAKE_GO, encoding="utf-8")
    go.chmod(0o755)
    return go


def test_builds_once_from_the_published_modules_and_removes_its_build_files(
    tmp_path: Path,
) -> None:
    env = environment(tmp_path, fake_go(tmp_path))
    first = run(env, "--path")
    assert first.returncode == 0, first.stderr
    binary = tmp_path / "cache" / "kube-apiserver" / "v1.34.2" / "kube-apiserver"
    assert first.stdout.strip() == str(binary)
    built_with = (tmp_path / "go.mod.seen").read_text(encoding="utf-8")
    assert "./staging" not in built_with
    assert "\tk8s.io/api => k8s.io/api v0.34.2\n" in built_with
    assert "\tk8s.io/kube-aggregator => k8s.io/kube-aggregator v0.34.2\n" in built_with
    listed = (tmp_path / "go.mod.seen.ls").read_text(encoding="utf-8").split()
    assert "vendor" not in listed
    assert "go.work" not in listed
    build = next(line for line in (tmp_path / "go.log").read_text().splitlines() if "build" in line)
    assert "k8s.io/component-base/version.gitVersion=v1.34.2" in build
    assert "gitMinor=34" in build
    assert build.endswith("./cmd/kube-apiserver")
    assert list((tmp_path / "tmp").iterdir()) == []  # module and build caches gone

    again = run(env, "--version")
    assert (again.returncode, again.stdout.strip()) == (0, "fake-kube-apiserver --version")
    calls = (tmp_path / "go.log").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["version", "mod", "build"]  # no second build


def test_an_installed_one_is_used_as_it_is(tmp_path: Path) -> None:
    env = environment(tmp_path, tmp_path / "no-go") | {"GPUWATCH_KUBE_APISERVER": "/usr/bin/true"}
    done = run(env, "--path")
    assert (done.returncode, done.stdout.strip()) == (0, "/usr/bin/true")


def test_a_failed_build_fails_and_caches_nothing(tmp_path: Path) -> None:
    go = tmp_path / "go"
    go.write_text("#!/bin/sh\necho 'go: module lookup disabled' >&2\nexit 1\n", encoding="utf-8")
    go.chmod(0o755)
    done = run(environment(tmp_path, go), "--version")
    assert done.returncode == 1
    assert "module lookup disabled" in done.stderr
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not (tmp_path / "cache" / "kube-apiserver" / "v1.34.2" / "kube-apiserver").exists()


def test_without_a_binary_or_go_it_says_so_and_exits_3(tmp_path: Path) -> None:
    done = run(environment(tmp_path, tmp_path / "no-go"), "--version")
    assert done.returncode == 3
    assert "no Go toolchain" in done.stderr
