"""Applies planned batches to Redis: the Lua scripts, one MULTI/EXEC round trip, reconnects.

The scripts are the conditional upserts that make every write idempotent and order-safe
(SINKS-redis.md explains each). A batch goes out as one transaction of EVALSHA calls; a
server that lost its script cache (a restart) answers NOSCRIPT, and the sink loads the
scripts and sends the batch again, which is harmless because every call is idempotent.
Connection errors, and the refusals Redis lifts by itself (full: OOM; a failed snapshot:
MISCONF; a read-only replica: READONLY; loading), are retried with capped exponential
backoff inside a time budget, then surface as `SinkUnavailable` so the writer keeps the
batch and retries later. Each failed attempt is counted by its reason (`errors`).

redis-py is synchronous: the worker calls it from its Redis writer thread
(sinks/redis/writer.py).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final, get_args
from urllib.parse import urlsplit, urlunsplit

from tenacity import RetryCallState, Retrying, wait_exponential

from schemas.settings import RedisSettings
from sinks.redis import client
from sinks.redis.client import (
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisConnectionError,
    RedisTimeoutError,
    ResponseError,
    TryAgainError,
)
from sinks.redis.keys import DEFAULT_PREFIX, RedisKeys
from sinks.redis.plan import Command, GpuLive, PlanOptions, ScriptName, SinkRecord, plan, plan_live
from sinks.redis.script_args import Positions, Rebuild

__all__ = [
    "SCRIPTS",
    "Backoff",
    "RedisSink",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "redact_url",
    "transient_reason",
]

log = logging.getLogger(__name__)

SCRIPTS: Final[dict[ScriptName, str]] = {
    name: resources.files("sinks.redis").joinpath("lua", f"{name}.lua").read_text("utf-8")
    for name in get_args(ScriptName)
}
"""Source of each script, from `lua/<name>.lua` (each file says its KEYS and ARGV)."""

_SHAS: Final = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}
# Server errors that go away by themselves (memory freed, a disk fixed, a failover
# finished, a busy script), by the code Redis answers with: the reason each is counted as.
_TRANSIENT: Final = {
    "OOM": "oom",
    "MISCONF": "misconf",
    "READONLY": "readonly",
    "BUSY": "busy",
    "TRYAGAIN": "tryagain",
    "LOADING": "loading",
    "MASTERDOWN": "masterdown",
    "CLUSTERDOWN": "clusterdown",
}
# redis-py takes the code off the errors it has a class for (OOM comes as OutOfMemoryError
# worded "command not allowed..."): those are known by their class.
_TRANSIENT_TYPES: Final = (
    (OutOfMemoryError, "oom"),
    (ReadOnlyError, "readonly"),
    (TryAgainError, "tryagain"),
    (ClusterDownError, "clusterdown"),
)
# How redis-py words an error Redis answered to a command queued in a transaction (a full
# Redis refuses the commands as they are queued, and the transaction is discarded).
_QUEUED = re.compile(r"^Command # \d+ \(.*\) of pipeline caused error: ", re.DOTALL)


class SinkError(Exception):
    """Base of the Redis sink's errors."""


class SinkUnavailable(SinkError):  # noqa: N818 - named for what the worker reacts to
    """Redis did not take the batch within the retry budget: keep the batch, retry later.

    `reason` says why, as counted in `RedisSink.errors`.
    """

    def __init__(self, message: str, reason: str = "connection") -> None:
        super().__init__(message)
        self.reason = reason


class SinkRejected(SinkError):  # noqa: N818 - named for what the worker reacts to
    """Redis refused a command for good (wrong key type, script error): retrying won't help."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential delays between attempts (tenacity's), within a budget per batch."""

    base_s: float = 0.05
    cap_s: float = 2.0  # a restarting Redis answers within seconds; no need to wait longer
    budget_s: float = 30.0  # well under Kafka's max.poll.interval.ms (300 s)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based): min(cap, base * 2**(n-1))."""
        state = RetryCallState(Retrying(), None, (), {})
        state.attempt_number = attempt
        return float(wait_exponential(multiplier=self.base_s, max=self.cap_s)(state))


def redact_url(url: str) -> str:
    """The URL with its password replaced by `***`, fit for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def transient_reason(err: BaseException) -> str | None:
    """The reason (`oom`, `misconf`, `readonly`...) of a server error that goes away by
    itself; None for any other error."""
    for kind, reason in _TRANSIENT_TYPES:
        if isinstance(err, kind):
            return reason
    if not isinstance(err, ResponseError):
        return None
    code = _QUEUED.sub("", str(err), count=1).split(" ", 1)[0]
    return _TRANSIENT.get(code)


def _unreachable_reason(err: RedisConnectionError | RedisTimeoutError) -> str:
    """The reason of a connection failure: auth, loading, timeout or connection."""
    if isinstance(err, AuthenticationError):
        return "auth"
    if isinstance(err, BusyLoadingError):
        return "loading"
    return "timeout" if isinstance(err, RedisTimeoutError) else "connection"


class RedisSink:
    """Writes decoded records to Redis per docs/DESIGN.md §5, one transaction per batch."""

    def __init__(
        self,
        settings: RedisSettings,
        *,
        key_prefix: str = DEFAULT_PREFIX,
        timeline_maxlen: int = 1000,
        alerts_maxlen: int = 10_000,
        backoff: Backoff | None = None,
        socket_timeout_s: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        url = settings.url.get_secret_value()
        self.options = PlanOptions(
            keys=RedisKeys(key_prefix),
            finished_ttl_s=settings.finished_ttl_s,
            timeline_maxlen=timeline_maxlen,
            alerts_maxlen=alerts_maxlen,
        )
        self.target = redact_url(url)
        self.errors: Counter[str] = Counter()
        """Attempts that failed, by reason (`oom`, `misconf`, `readonly`, `connection`...)."""
        self._backoff = backoff or Backoff()
        self._sleep, self._clock = sleep, clock
        # Our own retry loop decides; redis-py retrying underneath would stretch the budget.
        self._client = client.connect(
            url, timeout_s=socket_timeout_s, connect_timeout_s=socket_timeout_s, retries=0
        )

    def __enter__(self) -> RedisSink:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._client.close()

    def plan(self, batch: Iterable[SinkRecord]) -> list[Command]:
        """The commands `apply` would send for `batch`."""
        return plan(batch, self.options)

    def apply(
        self,
        batch: Iterable[SinkRecord],
        positions: tuple[str, Mapping[str, int]] | None = None,
        live: Sequence[GpuLive] = (),
    ) -> None:
        """Writes one batch; raises SinkUnavailable after the retry budget, SinkRejected.

        `positions` (group, `{topic}:{partition}` -> next offset) are stored in the same
        transaction (`RedisKeys.positions`), so they say what this Redis holds. `live` are
        GPU live states already coalesced to one per GPU (`LiveGpus`), written as they are.
        """
        commands = self.plan(batch)
        commands += plan_live(live, self.options)
        if positions is not None and positions[1]:
            group, offsets = positions
            flat = tuple(str(part) for item in sorted(offsets.items()) for part in item)
            call = Positions(positions=self.options.keys.positions(group), offsets=flat)
            commands.append(Command.of(call))
        if commands:
            self.execute(commands)

    def positions(self, group: str) -> dict[str, int]:
        """The positions stored for `group` (empty when none); SinkUnavailable if unreachable."""
        raw = self._read(lambda: self._client.hgetall(self.options.keys.positions(group)))
        return {_text(k): int(v) for k, v in raw.items()}

    def evictions(self) -> tuple[str, int]:
        """Redis's run id (new at each start) and how many keys it has evicted since it
        started (`INFO`; the count is the server's, every prefix and database)."""
        info = self._read(self._client.info)
        return str(info["run_id"]), int(info["evicted_keys"])

    def generation(self, group: str) -> int:
        """How many times `rebuild` deleted the keys (0: never, or Redis lost the count)."""
        key = self.options.keys.rebuild(group)
        value = self._read(lambda: self._client.hget(key, "generation"))
        return 0 if value is None else int(value)

    def rebuild(self, group: str, evictions: tuple[str, int]) -> int:
        """Delete every key of the prefix, to be written anew from the topics, unless it was
        done for these `evictions` already (another writer of the group noticed them first);
        the generation after.

        One script: atomic, so no batch lands halfway through (it blocks Redis while it
        scans the prefix's keys, a rare event: Redis evicted keys)."""
        run_id, evicted = evictions
        _, keys, args = Rebuild(
            rebuild=self.options.keys.rebuild(group),
            pattern=re.sub(r"([*?\[\]\\])", r"\\\1", self.options.keys.prefix) + "*",
            keep_prefix=self.options.keys.rebuild(""),
            evicted=str(evicted),
            run_id=run_id,
        ).flat()
        source = SCRIPTS["rebuild"]
        return int(self._read(lambda: self._client.eval(source, len(keys), *keys, *args)))

    def _read(self, call: Callable[[], Any]) -> Any:
        """One call, its connection failures counted and raised as SinkUnavailable."""
        try:
            return call()
        except (RedisConnectionError, RedisTimeoutError) as err:
            reason = _unreachable_reason(err)
            self.errors[reason] += 1
            raise SinkUnavailable(f"redis {self.target} unavailable: {err}", reason) from err

    def execute(self, commands: Sequence[Command]) -> None:
        """Sends planned commands in one transaction, retrying connection failures."""
        deadline = self._clock() + self._backoff.budget_s
        attempt = 0
        while True:
            attempt += 1
            try:
                self._attempt(commands)
            except (RedisConnectionError, RedisTimeoutError, _Transient) as err:
                reason = err.reason if isinstance(err, _Transient) else _unreachable_reason(err)
                self.errors[reason] += 1
                delay = self._backoff.delay(attempt)
                if self._clock() + delay > deadline:
                    raise SinkUnavailable(
                        f"redis {self.target} unavailable after {attempt} attempts: {err}", reason
                    ) from err
                log.warning(
                    "redis sink retrying target=%s reason=%s attempt=%d retry_in_s=%.2f error=%r",
                    self.target, reason, attempt, delay, str(err),
                )  # fmt: skip
                self._sleep(delay)
                continue
            if attempt > 1:
                log.info("redis sink recovered target=%s attempts=%d", self.target, attempt)
            return

    def _attempt(self, commands: Sequence[Command]) -> None:
        """One transaction; loads the scripts and resends once if the server lacks them."""
        results = self._transaction(commands)
        if any(isinstance(r, NoScriptError) for r in results):
            with self._client.pipeline(transaction=False) as pipe:
                for source in SCRIPTS.values():
                    pipe.script_load(source)
                pipe.execute()
            results = self._transaction(commands)
        for command, result in zip(commands, results, strict=True):
            if isinstance(result, Exception) and (reason := transient_reason(result)):
                raise _Transient(reason, str(result)) from result
            if isinstance(result, ResponseError):
                raise SinkRejected(f"{command.script} on {command.keys[0]}: {result}") from result

    def _transaction(self, commands: Sequence[Command]) -> list[Any]:
        """MULTI, the EVALSHA calls, EXEC: one round trip; errors come back as values."""
        with self._client.pipeline(transaction=True) as pipe:
            for command in commands:
                pipe.evalsha(_SHAS[command.script], len(command.keys), *command.keys, *command.args)
            try:
                return pipe.execute(raise_on_error=False)
            except ResponseError as err:
                if reason := transient_reason(err):
                    raise _Transient(reason, str(err)) from err
                raise SinkRejected(str(err)) from err


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Transient(Exception):  # noqa: N818 - internal marker, never escapes the sink
    """A server error that retrying fixes (read-only replica, OOM, loading), and its reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
