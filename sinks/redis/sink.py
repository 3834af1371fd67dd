"""Applies planned batches to Redis: the Lua scripts, one MULTI/EXEC round trip, reconnects.

The scripts are the conditional upserts that make every write idempotent and order-safe
(SINKS-redis.md explains each). A batch goes out as one transaction of EVALSHA calls; a
server that lost its script cache (a restart) answers NOSCRIPT, and the sink loads the
scripts and sends the batch again, which is harmless because every call is idempotent.
Connection errors are retried with capped exponential backoff inside a time budget, then
surface as `SinkUnavailable` so the worker keeps the batch and retries later.

redis-py is synchronous: the worker calls it from its Redis writer thread
(gpuwatch/run/worker_sinks.py).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from schemas.settings import RedisSettings
from sinks.redis.keys import DEFAULT_PREFIX, RedisKeys
from sinks.redis.plan import Command, GpuLive, PlanOptions, ScriptName, SinkRecord, plan, plan_live

__all__ = [
    "SCRIPTS",
    "Backoff",
    "RedisSink",
    "SinkError",
    "SinkRejected",
    "SinkUnavailable",
    "redact_url",
]

log = logging.getLogger(__name__)

_RANK = "local RANK = {queued = 1, running = 2, stalled = 3, finished = 4}\n"
_EXPIRE_POD = """
local function expire_pod(ttl, first, last)
  for i = first, last do redis.call('EXPIRE', KEYS[i], ttl, 'NX') end
end
"""

SCRIPTS: Final[dict[ScriptName, str]] = {
    # KEYS pod, windows, timeline, seen, state:queued..finished. ARGV uid, ts, to_state,
    # reason, namespace, pod, node, labels, ttl_s. The newest transition wins, ordered by
    # (finished, ts, rank, reason): order-independent, and finished is terminal.
    "pod_transition": _RANK
    + _EXPIRE_POD
    + """
local uid, ts, state, reason = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local cur = redis.call('HMGET', KEYS[1], 'state', 'state_since', 'updated_at', 'reason')
if cur[1] and RANK[cur[1]] and cur[2] then
  local since, old_fin, new_fin = tonumber(cur[2]), cur[1] == 'finished', state == 'finished'
  if old_fin ~= new_fin then
    if old_fin then return 0 end
  elseif ts < since then return 0
  elseif ts == since then
    if RANK[state] < RANK[cur[1]] then return 0 end
    if RANK[state] == RANK[cur[1]] and reason < (cur[4] or '') then return 0 end
  end
end
local updated = ARGV[2]
if cur[3] and tonumber(cur[3]) and tonumber(cur[3]) > ts then updated = cur[3] end
redis.call('HSET', KEYS[1], 'namespace', ARGV[5], 'pod', ARGV[6], 'labels', ARGV[8],
  'state', state, 'state_since', ARGV[2], 'reason', reason, 'updated_at', updated)
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'node', ARGV[7])
else redis.call('HSETNX', KEYS[1], 'node', '') end
for i = 5, 8 do redis.call('ZREM', KEYS[i], uid) end
redis.call('ZADD', KEYS[4 + RANK[state]], ARGV[2], uid)
if state == 'finished' then
  local ttl = tonumber(ARGV[9])
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', '(' .. string.format('%d', ts - ttl * 1000))
  expire_pod(ttl, 1, 4)
end
return 1
""",
    # KEYS pod, windows, timeline, seen, waste pods/namespaces of the window, of the hour,
    # window index. ARGV uid, namespace, pod, node, labels, window_start, window_end,
    # cost_nusd, waste_nusd, vram_bytes, share, gpus, state, ttl_s, hour_ms, per-window key
    # prefixes (pods, namespaces). Totals and leaderboards move by the difference to the
    # value stored for this window, in nano-USD: a replay moves them by exactly zero.
    "pod_window": _EXPIRE_POD
    + """
local uid, ns, ws, we = ARGV[1], ARGV[2], ARGV[6], tonumber(ARGV[7])
local function usd(n)
  local s = string.format('%010d', math.abs(n))
  return (n < 0 and '-' or '') .. string.sub(s, 1, -10) .. '.' .. string.sub(s, -9)
end
local totals = {}
for i, kind in ipairs({'cost', 'waste'}) do
  local new = tonumber(ARGV[7 + i])
  local old = tonumber(redis.call('HGET', KEYS[2], kind .. ':' .. ws) or '0')
  local total = tonumber(redis.call('HGET', KEYS[2], kind .. ':total') or '0')
  if new ~= old then
    redis.call('HSET', KEYS[2], kind .. ':' .. ws, ARGV[7 + i])
    total = redis.call('HINCRBY', KEYS[2], kind .. ':total', string.format('%d', new - old))
  end
  totals[i] = usd(total)
end
local cur = redis.call('HMGET', KEYS[1], 'window_start', 'updated_at', 'state')
local f = {'namespace', ns, 'pod', ARGV[3], 'cost_usd', totals[1], 'waste_usd', totals[2]}
if not cur[1] or tonumber(ws) >= tonumber(cur[1]) then
  for _, v in ipairs({'window_start', ws, 'labels', ARGV[5], 'vram_bytes', ARGV[10],
      'share', ARGV[11], 'gpus', ARGV[12]}) do f[#f + 1] = v end
  if ARGV[4] ~= '' then f[#f + 1] = 'node'; f[#f + 1] = ARGV[4] end
end
if not cur[2] or we > tonumber(cur[2]) then f[#f + 1] = 'updated_at'; f[#f + 1] = ARGV[7] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('HSETNX', KEYS[1], 'node', '')
if cur[3] == 'finished' or ARGV[13] == 'finished' then expire_pod(tonumber(ARGV[14]), 1, 4) end
-- Scores are rounded to whole nano-dollars after every change, so a sum does not depend
-- on the order its terms arrived in.
local function bump(key, member, delta)
  local score = tonumber(redis.call('ZINCRBY', key, delta, member))
  local exact = string.format('%.9f', score)
  if tonumber(exact) <= 0 then redis.call('ZREM', key, member)
  elseif tonumber(exact) ~= score then redis.call('ZADD', key, exact, member) end
end
local top = redis.call('ZRANGE', KEYS[9], -1, -1, 'WITHSCORES')
local newest = top[2] and tonumber(top[2]) or -1
local horizon = math.max(newest, we) - tonumber(ARGV[15])
if tonumber(ws) < horizon then return 0 end
local new = tonumber(ARGV[9])
local old = tonumber(redis.call('ZSCORE', KEYS[5], uid) or '0')
old = math.floor(old * 1e9 + 0.5)
if new ~= old then
  if new > 0 then redis.call('ZADD', KEYS[5], usd(new), uid)
  else redis.call('ZREM', KEYS[5], uid) end
  for _, km in ipairs({{KEYS[6], ns}, {KEYS[7], uid}, {KEYS[8], ns}}) do
    bump(km[1], km[2], usd(new - old))
  end
end
redis.call('ZADD', KEYS[9], ARGV[7], ws)
if we <= newest then return 1 end
for _, m in ipairs(redis.call('ZRANGE', KEYS[9], 0, -1)) do
  if tonumber(m) < horizon then
    for j, prefix in ipairs({ARGV[16], ARGV[17]}) do
      local window = prefix .. m
      local entries = redis.call('ZRANGE', window, 0, -1, 'WITHSCORES')
      for k = 1, #entries, 2 do bump(KEYS[6 + j], entries[k], '-' .. entries[k + 1]) end
      redis.call('DEL', window)
    end
    redis.call('ZREM', KEYS[9], m)
  end
end
return 1
""",
    # KEYS stream, seen[, pod]. ARGV identity, ts, maxlen, ttl_s, field/value pairs. Skips
    # an identity already seen (or older than every remembered one once the cap is full).
    "timeline_add": _EXPIRE_POD
    + """
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local ts, maxlen = tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call('ZCARD', KEYS[2]) >= maxlen then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if ts <= tonumber(oldest[2]) then return 0 end
end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, string.format('%d', -(maxlen + 1)))
local id = ARGV[2] .. '-*'
local top = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if top then
  local top_ms = string.match(top[1], '^(%d+)')
  if tonumber(top_ms) > ts then id = top_ms .. '-*' end
end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[3], id, unpack(ARGV, 5))
if KEYS[3] and redis.call('HGET', KEYS[3], 'state') == 'finished' then
  expire_pod(tonumber(ARGV[4]), 1, 2)
end
return 1
""",
    # KEYS firing, last. ARGV fingerprint, status, ts, json, ttl_ms. The latest status
    # wins; at equal ts resolved beats firing, and equal firing messages tie on their JSON.
    "alert_state": """
local fp, status, ts = ARGV[1], ARGV[2], tonumber(ARGV[3])
local last = redis.call('ZSCORE', KEYS[2], fp)
if last then
  last = tonumber(last)
  if ts < last then return 0 end
  if ts == last and status == 'firing' then
    local shown = redis.call('HGET', KEYS[1], fp)
    if not shown or ARGV[4] < shown then return 0 end
  end
end
redis.call('ZADD', KEYS[2], ARGV[3], fp)
if status == 'firing' then redis.call('HSET', KEYS[1], fp, ARGV[4])
else redis.call('HDEL', KEYS[1], fp) end
local cutoff = string.format('%d', ts - tonumber(ARGV[5]))
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', '(' .. cutoff)
return 1
""",
    # KEYS hash[, index]. ARGV order field, order value, index member, field/value pairs.
    # KEYS positions hash. ARGV field, offset, ...: each offset only moves forward.
    "positions": """
for i = 1, #ARGV, 2 do
  local cur = redis.call('HGET', KEYS[1], ARGV[i])
  if not cur or tonumber(cur) < tonumber(ARGV[i + 1]) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return 1
""",
    # KEYS index, hash per GPU. ARGV one JSON array of rows [uuid, updated_at, field, value,
    # ...], one per hash in KEYS order. Each hash takes its row unless it holds a newer
    # updated_at; the index scores each uuid by its newest updated_at.
    "gpu_live": """
local rows = cjson.decode(ARGV[1])
local written = 0
for i, row in ipairs(rows) do
  local key = KEYS[i + 1]
  local cur = redis.call('HGET', key, 'updated_at')
  if not cur or tonumber(cur) <= tonumber(row[2]) then
    redis.call('HSET', key, 'updated_at', row[2], unpack(row, 3))
    redis.call('ZADD', KEYS[1], 'GT', row[2], row[1])
    written = written + 1
  end
end
return written
""",
    "hset_if_newer": """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur and tonumber(cur) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2], unpack(ARGV, 4))
if KEYS[2] then redis.call('ZADD', KEYS[2], 'GT', ARGV[2], ARGV[3]) end
return 1
""",
}

_SHAS: Final = {name: hashlib.sha1(src.encode()).hexdigest() for name, src in SCRIPTS.items()}
# Server errors that go away by themselves (failover, memory pressure, a busy script).
_TRANSIENT = ("OOM", "MISCONF", "BUSY", "TRYAGAIN", "LOADING", "MASTERDOWN", "CLUSTERDOWN")


class SinkError(Exception):
    """Base of the Redis sink's errors."""


class SinkUnavailable(SinkError):  # noqa: N818 - named for what the worker reacts to
    """Redis did not take the batch within the retry budget: keep the batch, retry later."""


class SinkRejected(SinkError):  # noqa: N818 - named for what the worker reacts to
    """Redis refused a command for good (wrong key type, script error): retrying won't help."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential delays between attempts, within a budget per batch."""

    base_s: float = 0.05
    cap_s: float = 2.0  # a restarting Redis answers within seconds; no need to wait longer
    budget_s: float = 30.0  # well under Kafka's max.poll.interval.ms (300 s)

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return float(min(self.cap_s, self.base_s * 2 ** min(attempt - 1, 30)))


def redact_url(url: str) -> str:
    """The URL with its password replaced by `***`, fit for logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


class RedisSink:
    """Writes decoded records to Redis per DESIGN.md §5, one transaction per batch."""

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
        self._backoff = backoff or Backoff()
        self._sleep, self._clock = sleep, clock
        # Our own retry loop decides; redis-py retrying underneath would stretch the budget.
        self._client: redis.Redis = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
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
            args = tuple(str(part) for item in sorted(offsets.items()) for part in item)
            commands.append(Command("positions", (self.options.keys.positions(group),), args))
        if commands:
            self.execute(commands)

    def positions(self, group: str) -> dict[str, int]:
        """The positions stored for `group` (empty when none); SinkUnavailable if unreachable."""
        try:
            raw = self._client.hgetall(self.options.keys.positions(group))
        except (RedisConnectionError, RedisTimeoutError) as err:
            raise SinkUnavailable(f"redis {self.target} unavailable: {err}") from err
        return {_text(k): int(v) for k, v in raw.items()}

    def execute(self, commands: Sequence[Command]) -> None:
        """Sends planned commands in one transaction, retrying connection failures."""
        deadline = self._clock() + self._backoff.budget_s
        attempt = 0
        while True:
            attempt += 1
            try:
                self._attempt(commands)
            except (RedisConnectionError, RedisTimeoutError, _Transient) as err:
                delay = self._backoff.delay(attempt)
                if self._clock() + delay > deadline:
                    raise SinkUnavailable(
                        f"redis {self.target} unavailable after {attempt} attempts: {err}"
                    ) from err
                log.warning(
                    "redis sink retrying target=%s attempt=%d retry_in_s=%.2f error=%r",
                    self.target, attempt, delay, str(err),
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
            if isinstance(result, ReadOnlyError) or (
                isinstance(result, ResponseError) and str(result).startswith(_TRANSIENT)
            ):
                raise _Transient(str(result)) from result
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
                if str(err).startswith(_TRANSIENT):
                    raise _Transient(str(err)) from err
                raise SinkRejected(str(err)) from err


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class _Transient(Exception):  # noqa: N818 - internal marker, never escapes the sink
    """A server error that retrying fixes (read-only replica, OOM, loading)."""
