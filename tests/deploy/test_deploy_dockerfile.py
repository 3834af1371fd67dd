"""The Dockerfile, checked without Docker: its stages, its user, and its build context.

No image can be built here (no Docker engine), so the build stage is replayed by hand on
the context Docker would send (the repository filtered by .dockerignore): the gRPC
codegen, then a wheel of the package. That proves the context holds everything the
install needs; the instructions themselves are checked for a non-root user, a pinned
slim Python and the gpuwatch entrypoint.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

Instruction = tuple[str, str]


def instructions() -> list[Instruction]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages() -> list[list[Instruction]]:
    found: list[list[Instruction]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            found.append([])
        if found:
            found[-1].append((keyword, rest))
    return found


def ignore_patterns() -> list[tuple[bool, re.Pattern[str]]]:
    """(exclude?, regex) per .dockerignore line, Docker's matching: last match wins."""
    patterns = []
    for raw in DOCKERIGNORE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        include = line.startswith("!")
        glob = line.lstrip("!").strip("/")
        regex = ""
        i = 0
        while i < len(glob):
            if glob.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif glob[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif glob[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif glob[i] == "[":
                end = glob.index("]", i)
                regex, i = regex + glob[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(glob[i]), i + 1
        patterns.append((not include, re.compile(regex)))
    return patterns


def excluded(path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves `path` out: the last pattern matching it or a parent decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for exclude, regex in patterns:
        if any(regex.fullmatch(c) for c in candidates):
            verdict = exclude
    return verdict


def context() -> set[str]:
    """The files of the build context, relative to the repository root."""
    patterns = ignore_patterns()
    reincluded = [r.pattern for exclude, r in patterns if not exclude]
    files = set()
    for folder, dirs, names in os.walk(ROOT):
        rel = Path(folder).relative_to(ROOT).as_posix()
        rel = "" if rel == "." else rel + "/"
        # Prune folders left out whose contents no `!` pattern brings back.
        dirs[:] = [
            d
            for d in dirs
            if not excluded(rel + d, patterns)
            or any(p.startswith(re.escape(rel + d)) for p in reincluded)
        ]
        files |= {rel + n for n in names if not excluded(rel + n, patterns)}
    return files


def test_two_stages_on_a_pinned_slim_python_3_11() -> None:
    build, runtime = stages()
    arg = next(rest for keyword, rest in instructions() if keyword == "ARG")
    assert arg == "PYTHON_IMAGE=python:3.11-slim-bookworm"
    assert build[0] == ("FROM", "${PYTHON_IMAGE} AS build")
    assert runtime[0] == ("FROM", "${PYTHON_IMAGE} AS runtime")
    copies = [rest for keyword, rest in runtime if keyword == "COPY"]
    assert copies == ["--from=build /opt/gpuwatch /opt/gpuwatch"]  # no sources, no pip cache


def test_the_build_generates_the_grpc_modules_and_installs_the_package() -> None:
    (build, _) = stages()
    runs = " && ".join(rest for keyword, rest in build if keyword == "RUN")
    steps = [s.strip() for s in runs.split("&&")]
    codegen = steps.index("/opt/gpuwatch/bin/python -m producers.podresources.codegen")
    install = steps.index("/opt/gpuwatch/bin/pip install --no-build-isolation .")
    assert codegen < install
    assert "/opt/gpuwatch/bin/gpuwatch --version" in steps[install:]  # the entry point works
    assert "/opt/gpuwatch/bin/pip uninstall --yes grpcio-tools" in steps[install:]


def test_it_runs_as_an_unprivileged_numeric_user_with_the_gpuwatch_entrypoint() -> None:
    _, runtime = stages()
    users = [rest for keyword, rest in runtime if keyword == "USER"]
    assert users == ["10001:10001"]  # numeric, so runAsNonRoot can check it
    user_index = runtime.index(("USER", "10001:10001"))
    after = [keyword for keyword, _ in runtime[user_index + 1 :]]
    assert "RUN" not in after  # nothing runs as root after the switch
    created = " ".join(rest for keyword, rest in runtime if keyword == "RUN")
    assert "--uid 10001" in created
    assert "--gid 10001" in created
    entrypoint = next(rest for keyword, rest in runtime if keyword == "ENTRYPOINT")
    assert json.loads(entrypoint) == ["gpuwatch"]
    env = " ".join(rest for keyword, rest in runtime if keyword == "ENV")
    assert "PATH=/opt/gpuwatch/bin:$PATH" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env  # the root filesystem may be read-only
    exposed = next(rest for keyword, rest in runtime if keyword == "EXPOSE").split()
    assert exposed == ["9480", "9481", "9482"]


def test_the_context_holds_the_package_and_nothing_local() -> None:
    files = context()
    find = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["setuptools"][
        "packages"
    ]["find"]
    packages = find_packages(where=str(ROOT), include=find["include"])
    assert {"streams.core", "streams.faust", "sinks.redis", "gpuwatch.cli"} <= set(packages)
    for package in packages:
        init = package.replace(".", "/") + "/__init__.py"
        assert init in files, init
    build, _ = stages()
    for keyword, rest in build:
        if keyword == "COPY":
            *sources, _ = shlex.split(rest)
            for source in (s.rstrip("/") for s in sources):
                assert source in files or any(f.startswith(source + "/") for f in files), source
    leaked = [
        f
        for f in files
        if f.startswith((".venv/", ".git/", "tests/", ".state/", "deploy/"))
        or "__pycache__" in f
        or re.search(r"api_pb2(_grpc)?\.pyi?$", f)
    ]
    assert leaked == []
    assert "producers/podresources/api.proto" in files


def test_the_context_builds_a_wheel_with_the_generated_modules(tmp_path: Path) -> None:
    """The build stage's two steps, run on a copy of the context."""
    src = tmp_path / "src"
    for rel in context():
        target = src / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ROOT / rel).read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    codegen = subprocess.run(
        [sys.executable, "-m", "producers.podresources.codegen"],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert codegen.returncode == 0, codegen.stderr
    assert (src / "producers" / "podresources" / "api_pb2_grpc.py").is_file()
    wheel = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-cache-dir", "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=300, env=env, check=False,
    )  # fmt: skip
    assert wheel.returncode == 0, wheel.stdout + wheel.stderr
    (built,) = (tmp_path / "dist").glob("gpuwatch-*.whl")
    with zipfile.ZipFile(built) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    for module in ("api_pb2.py", "api_pb2.pyi", "api_pb2_grpc.py", "api.proto"):
        assert f"producers/podresources/{module}" in names, module
    assert "gpuwatch/cli/main.py" in names
    assert any(n.startswith("schemas/json/") and n.endswith(".json") for n in names)
    assert "sinks/redis/lua/gpu_live.lua" in names  # package data: the Redis scripts
    assert "gpuwatch = gpuwatch.cli:main" in scripts
