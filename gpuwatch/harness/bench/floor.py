"""The Faust floor of `gpuwatch bench worker`: an agent that only decodes the samples it reads.

Run as `python -m gpuwatch.harness.bench.floor TOPIC LAST [inbox]` with the worker's settings in
the environment; `LAST` is a JSON object, partition -> the offset to read up to (records
after it are decoded as they come); `inbox`: records delivered as the worker's agents get
them, else through Faust's stream. The app is `gpuwatch.harness.bench.floor_app`: the worker's app
stripped to its consumer. It prints one JSON line (seconds and CPU seconds from the first batch to
the last, GPU-samples) and exits. What the worker costs above it is its own.
"""

from __future__ import annotations

import json
import os
import sys

from gpuwatch.config import load_settings
from gpuwatch.harness.bench.floor_app import run_floor

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Read `TOPIC` from the start until each partition's `LAST` offset; print the figures."""
    topic_name = argv[0]
    left = {int(p): int(last) for p, last in json.loads(argv[1]).items()}
    inbox = argv[2:] == ["inbox"]
    run_floor(load_settings(), topic_name, left, _print_and_exit, inbox=inbox)
    return 1  # the agent exits the process once it has read everything


def _print_and_exit(figures: dict[str, float]) -> None:
    print(json.dumps(figures), flush=True)
    os._exit(0)  # the figures are out; a clean Faust stop takes seconds


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
