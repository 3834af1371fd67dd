"""Commands run from a test: output captured as text, exit status for the test, no child left."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path


def run_command(
    argv: Sequence[str],
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to its end (at most `timeout_s`) with stdout and stderr captured as text; a
    non-zero exit does not raise, so the test asserts on it with the output in the message."""
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        cwd=cwd,
        check=False,
    )


@contextmanager
def reaped(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """`process` for the block; killed and collected on the way out if it still runs (the
    block failed before it ended), so a failing test leaves no child behind."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
