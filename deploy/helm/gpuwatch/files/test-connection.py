"""`helm test` of a gpuwatch release: the worker serves its metrics, the Redis sink writes.

Run as `python -c` in the gpuwatch image by templates/tests/test-connection.yaml, with
METRICS_URL (the worker Service's /metrics), GPUWATCH_REDIS_URL (the Redis sink's own URL;
absent when the release has no Redis sink) and WAIT_S. A release just installed may not
have served or written anything yet, so each check is tried again until WAIT_S seconds
have passed. One line per check says what was found; the exit status is 1 if one failed.
"""

import os
import sys
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from sinks.redis.client import RedisError, connect
from sinks.redis.keys import RedisKeys

RETRY_S = 2.0  # a sample a second reaches Redis within a poll: no need to hammer
TIMEOUT_S = 5.0  # one request; a Service without endpoints would otherwise hang


def metrics(url: str) -> tuple[bool, str]:
    """The worker's /metrics has gpuwatch families (declared as soon as it serves)."""
    with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
        text = response.read().decode("utf-8")
    names = sorted(f.name for f in text_string_to_metric_families(text))
    ours = [name for name in names if name.startswith("gpuwatch_")]
    if not ours:
        return False, f"{url} serves no gpuwatch_ metric ({len(names)} others)"
    return True, f"{url} serves {len(ours)} gpuwatch_ metrics ({ours[0]}...)"


def redis(url: str) -> tuple[bool, str]:
    """The sink has written the live GPUs: the key every node sample it reads refreshes,
    there with or without GPU pods."""
    key = RedisKeys().gpus()
    client = connect(url, timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S, retries=0)
    try:
        gpus = client.zcard(key)
    finally:
        client.close()
    if not gpus:
        return False, f"Redis has no {key} yet: no node sample reached the Redis sink"
    return True, f"Redis {key} holds {gpus} GPUs"


def wait(name: str, check: Callable[[], tuple[bool, str]], deadline: float) -> bool:
    while True:
        try:
            passed, said = check()
        except (OSError, ValueError, RedisError) as err:
            passed, said = False, f"{type(err).__name__}: {err}"
        if passed or time.monotonic() >= deadline:
            print(f"{'ok' if passed else 'FAILED'} {name}: {said}", flush=True)
            return passed
        time.sleep(RETRY_S)


def main() -> int:
    deadline = time.monotonic() + float(os.environ.get("WAIT_S", "120"))
    passed = wait("worker metrics", lambda: metrics(os.environ["METRICS_URL"]), deadline)
    redis_url = os.environ.get("GPUWATCH_REDIS_URL")
    if redis_url:
        passed = wait("redis sink", lambda: redis(redis_url), deadline) and passed
    else:
        print("skipped redis sink: the release has none", flush=True)
    return 0 if passed else 1


sys.exit(main())
