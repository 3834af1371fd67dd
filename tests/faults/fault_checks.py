"""Checks the fault tests share: records compared by identity, and Redis against the derived topics.

What Redis must hold is worked out here from the derived topics alone, by the rules of
docs/DESIGN.md §5 (a pod's state is its latest transition, a finished pod stays finished; a pod's
cost is the sum of its attribution records, each identity once; an alert fires while its
latest message fires), not by the sink's code.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec
import redis
from worker_fixtures import Identities, decoded

from schemas import ALERTS, ATTRIBUTION, GPU_WINDOWS, POD_LIFECYCLE
from schemas.settings import Settings
from sinks.redis.keys import RedisKeys

RANK = {"queued": 0, "running": 1, "stalled": 2, "finished": 3}
KEYS_OF = RedisKeys()  # `gpuwatch:`, the worker's key names


def differences(got: Identities, want: Identities) -> list[str]:
    """What keeps `got` from holding every record of `want`, each copy equal (empty: none)."""
    problems: list[str] = []
    for topic, records in want.items():
        for identity, (record, *more) in records.items():
            if more:
                problems.append(f"{topic} {identity}: {1 + len(more)} copies in the reference")
            copies = got[topic].get(identity)
            if not copies:
                problems.append(f"{topic} {identity}: missing")
                continue
            for copy in copies:
                diff = {
                    name: (getattr(copy, name), value)
                    for name, value in msgspec.structs.asdict(record).items()
                    if getattr(copy, name) != value
                }
                if diff:
                    problems.append(f"{topic} {identity}: differs {diff}")
    return problems


def subject_of(topic: str, record: Any) -> str:
    """The pod uid, GPU uuid or node a derived record is about."""
    if topic == "gpu.windows":
        return str(record.uuid)
    if topic == "alerts":
        s = record.subject
        return str({"pod": s.uid, "gpu": s.uuid, "node": s.node}[s.kind])
    return str(record.uid)


def latest_states(settings: Settings) -> dict[str, tuple[str, int]]:
    """Each pod's (state, since) by its transitions: the latest wins, finished stays finished."""
    best: dict[str, tuple[bool, int, int, str, str]] = {}
    for change in decoded(settings, POD_LIFECYCLE):
        finished = change.to_state == "finished"
        order = (finished, change.ts, RANK[change.to_state], change.reason or "", change.to_state)
        if change.uid not in best or order > best[change.uid]:
            best[change.uid] = order
    return {uid: (order[4], order[1]) for uid, order in best.items()}


def costs(settings: Settings) -> dict[str, Decimal]:
    """Each pod's cost: the sum over its attribution records, one per identity."""
    per_window: dict[tuple[str, int], Decimal] = {}
    for record in decoded(settings, ATTRIBUTION):
        per_window[(record.uid, record.window_start)] = Decimal(str(record.cost_usd))
    out: dict[str, Decimal] = {}
    for (uid, _), cost in per_window.items():
        out[uid] = out.get(uid, Decimal(0)) + cost
    return out


def firing(settings: Settings) -> set[str]:
    """Fingerprints whose latest alert message fires (a resolve wins a tie)."""
    latest: dict[str, tuple[int, int, str]] = {}
    for alert in decoded(settings, ALERTS):
        order = (alert.ts, alert.status == "resolved", alert.status)
        if alert.fingerprint not in latest or order > latest[alert.fingerprint]:
            latest[alert.fingerprint] = order
    return {fp for fp, (_, _, status) in latest.items() if status == "firing"}


def last_windows(settings: Settings) -> dict[str, int]:
    """Each GPU's latest window start."""
    out: dict[str, int] = {}
    for window in decoded(settings, GPU_WINDOWS):
        out[window.uuid] = max(out.get(window.uuid, window.window_start), window.window_start)
    return out


def redis_mismatches(client: redis.Redis, settings: Settings) -> list[str]:
    """Where Redis (the `gpuwatch:` keys) differs from what the derived topics say."""
    problems: list[str] = []
    try:
        pod_costs = costs(settings)
        for uid, (state, since) in latest_states(settings).items():
            pod = client.hgetall(KEYS_OF.pod(uid).encode())
            shown = (pod.get(b"state"), pod.get(b"state_since"))
            if shown != (state.encode(), str(since).encode()):
                problems.append(f"pod {uid!r}: {shown} in Redis, ({state}, {since}) in the topics")
                continue
            member = client.zscore(KEYS_OF.state(state).encode(), uid.encode())
            if member != since:
                problems.append(f"pod {uid!r}: score {member} in state:{state}, not {since}")
            want = pod_costs.get(uid, Decimal(0))
            got = Decimal(pod.get(b"cost_usd", b"0").decode())
            if abs(got - want) > Decimal("1e-8"):
                problems.append(f"pod {uid!r}: cost {got} in Redis, {want} in the topics")
        for uuid, start in last_windows(settings).items():
            gpu = client.hgetall(KEYS_OF.gpu(uuid).encode())
            if gpu.get(b"window_start") != str(start).encode():
                problems.append(f"gpu {uuid!r}: window {gpu.get(b'window_start')!r}, not {start}")
        shown_firing = {fp.decode() for fp in client.hkeys(KEYS_OF.alerts_firing())}
        if shown_firing != firing(settings):
            problems.append(f"firing alerts: {sorted(shown_firing)} vs {sorted(firing(settings))}")
    except redis.ConnectionError as exc:
        problems.append(f"Redis away: {exc}")
    return problems
