"""The `gpuwatch` command as a user runs it: help, settings errors, stack and topics."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from schemas import ALL_TOPICS
from schemas.settings import Settings

GPUWATCH = Path(sys.executable).with_name("gpuwatch")


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(GPUWATCH), *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ((), ["stack", "topics", "settings", "GPUWATCH_CONFIG"]),
        (("stack",), ["up", "down", "status", "state directory"]),
        (("stack", "up"), ["idempotent", "metadata request"]),
        (("stack", "down"), ["started", "left alone"]),
        (("stack", "status"), ["Exits 1"]),
        (("topics",), ["create", "list"]),
        (("topics", "create"), ["co-partitioned", "--partitions", "--replication-factor"]),
        (("topics", "list"), ["partition count"]),
        (("settings",), ["masked"]),
        (("sink",), ["redis", "metrics"]),
        (("sink", "metrics"), ["consumer group", "GPUWATCH_SINK_EXPORTER_PORT", "pod.lifecycle"]),
        (("sink", "redis"), ["consumer group", "GPUWATCH_SINK_METRICS_PORT", "SIGTERM"]),
    ],
)
def test_every_verb_explains_itself(argv: tuple[str, ...], expected: list[str]) -> None:
    result = run(*argv, "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    for phrase in expected:
        assert phrase in text, f"{phrase!r} not in `gpuwatch {' '.join(argv)} --help`"


def test_a_missing_verb_is_a_usage_error() -> None:
    result = run()
    assert result.returncode == 2
    assert "required: VERB" in result.stderr


def test_a_bad_setting_fails_at_start_naming_the_variable() -> None:
    result = run("settings", env={"GPUWATCH_WINDOW_S": "abc"})
    assert result.returncode == 2
    assert "GPUWATCH_WINDOW_S='abc'" in result.stderr
    assert "Traceback" not in result.stderr


def test_settings_shows_what_is_in_force_with_secrets_masked() -> None:
    result = run(
        "--topic-prefix",
        "replay7.",
        "settings",
        env={"GPUWATCH_STALL_AFTER_S": "120", "GPUWATCH_REDIS_URL": "redis://:pw9@h:6379/0"},
    )
    assert result.returncode == 0, result.stderr
    assert "topic_prefix: replay7." in result.stdout
    assert "stall_after_s: 120" in result.stdout
    assert "pw9" not in result.stdout


@pytest.mark.integration
def test_stack_up_twice_then_status_shows_three_services(stack: Settings) -> None:
    first = run("stack", "up")
    assert first.returncode == 0, first.stderr
    second = run("stack", "up")
    assert second.returncode == 0, second.stderr
    row = re.compile(r"^(kafka|redis|prometheus)\s+(?:up|external)\s+\S+\s+(\S+)", re.M)
    pids_first = row.findall(first.stdout)
    pids_second = row.findall(second.stdout)
    assert len(pids_first) == 3, first.stdout
    assert pids_first == pids_second, "a second `stack up` restarted a service"

    status = run("stack", "status")
    assert status.returncode == 0, status.stdout + status.stderr
    services = re.findall(r"^(kafka|redis|prometheus)\s+(up|external)\b", status.stdout, re.M)
    assert sorted(name for name, _ in services) == ["kafka", "prometheus", "redis"]


@pytest.mark.integration
def test_topics_create_is_idempotent_from_the_command_line(
    stack: Settings, topic_prefix: str
) -> None:
    env = {"GPUWATCH_TOPIC_PREFIX": topic_prefix, "GPUWATCH_KAFKA_PARTITIONS": "2"}
    try:
        first = run("topics", "create", env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        assert first.stdout.count(" created") == len(ALL_TOPICS) == 13, first.stdout
        second = run("topics", "create", env=env)
        assert second.returncode == 0, second.stdout + second.stderr
        assert second.stdout.count(" exists") == len(ALL_TOPICS), second.stdout
        listed = run("topics", "list", env=env)
        assert listed.returncode == 0
        assert f"{topic_prefix}nvml.samples" in listed.stdout
    finally:
        _delete_topics(stack, topic_prefix)


def _delete_topics(settings: Settings, prefix: str) -> None:
    from topic_io import delete_prefixed

    delete_prefixed(settings, [prefix])
