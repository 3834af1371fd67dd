"""`gpuwatch top`: reads pods, GPUs, firing alerts and the fleet's capacity from Redis and
shows them, once or live.

The pod set comes from the state sorted sets, not a SCAN, and a refresh costs at most
three round trips: the set sizes, uids, firing alerts and the capacity hash; every pod and
GPU hash in one pipeline; the names of GPU owners that were not read as rows. At most
`max_rows` pods and GPUs are read per refresh (pods that want attention first), and the view
says how many were left out. What is shown is `gpuwatch/top/view.py`, drawn by
`gpuwatch/top/text.py` (tables, with `rich`) and `gpuwatch/top/as_json.py`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from os import terminal_size
from typing import Any, Final, TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.segment import Segments
from rich.text import Text

from gpuwatch.tables import plain
from gpuwatch.top.as_json import render_json
from gpuwatch.top.capacity import parse_capacity
from gpuwatch.top.text import Frame, fit_screen, frame, render_text
from gpuwatch.top.view import (
    AlertRow,
    GpuRow,
    Header,
    PodRow,
    Query,
    Snapshot,
)
from gpuwatch.top.workloads import parse_workload
from schemas.fields import DEFAULT_CLUSTER, LifecycleState
from schemas.settings import RedisSettings
from sinks.redis import client
from sinks.redis.keys import DEFAULT_PREFIX, STATES, RedisKeys
from sinks.redis.sink import redact_url

__all__ = [
    "MAX_ROWS",
    "READ_ORDER",
    "Reader",
    "TopOptions",
    "TopUnavailable",
    "live",
    "parse_alert",
    "parse_gpu",
    "parse_pod",
    "pick_uids",
    "run",
]

log = logging.getLogger(__name__)

MAX_ROWS: Final = 3000  # a few thousand hashes in one pipeline read in well under a second
READ_ORDER: Final[tuple[LifecycleState, ...]] = ("stalled", "queued", "running", "finished")
"""Order the state sets fill the `max_rows` cap in: the pods that want attention first."""
SOCKET_TIMEOUT_S: Final = 5.0  # a view that hangs longer than this is worse than an error


class TopUnavailable(Exception):  # noqa: N818 - named for what the user sees
    """Redis could not be read; the message names the URL (password redacted)."""


@dataclass(frozen=True, slots=True)
class TopOptions:
    """What `gpuwatch top` was asked for."""

    query: Query = field(default_factory=Query)
    key_prefix: str = DEFAULT_PREFIX
    max_rows: int = MAX_ROWS
    interval_s: float = 2.0
    once: bool = False
    json: bool = False

    def __post_init__(self) -> None:
        RedisKeys(self.key_prefix)  # raises ValueError for a prefix the sink cannot have
        if self.max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        if self.interval_s <= 0:
            raise ValueError("interval must be positive")
        if self.query.limit is not None and self.query.limit < 1:
            raise ValueError("limit must be at least 1")


# -- hashes -> rows (pure) ----------------------------------------------------------------------


def _int(value: str | None) -> int | None:
    """A hash field as an integer; None for "" (the sink's null) or garbage."""
    try:
        return int(value) if value else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _json(value: str | None) -> Any:
    try:
        return json.loads(value) if value else None
    except ValueError:
        return None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def parse_pod(uid: str, fields: Mapping[str, str]) -> PodRow | None:
    """A `pod:{uid}` hash as a row; None when the hash is gone (an expired finished pod)."""
    if not fields.get("state"):
        return None
    gpus = _json(fields.get("gpus"))
    uuids = tuple(
        str(g["uuid"]) for g in (gpus if isinstance(gpus, list) else ()) if isinstance(g, dict)
    )
    return PodRow(
        uid=uid,
        namespace=fields.get("namespace", ""),
        pod=fields.get("pod", ""),
        state=fields["state"],
        state_since=_int(fields.get("state_since")),
        reason=fields.get("reason", ""),
        node=fields.get("node", ""),
        labels=_labels(_json(fields.get("labels"))),
        gpus=uuids,
        share=_float(fields.get("share")),
        vram_bytes=_int(fields.get("vram_bytes")),
        cost_usd=_float(fields.get("cost_usd")) or 0.0,
        waste_usd=_float(fields.get("waste_usd")) or 0.0,
        cluster=fields.get("cluster") or DEFAULT_CLUSTER,
        cost_per_unit=_per_unit(_json(fields.get("cost_per_unit"))),
    )


def _per_unit(value: object) -> dict[str, float | None]:
    """The `cost_per_unit` JSON object; what is not a number (or null) is left out."""
    if not isinstance(value, dict):
        return {}
    return {
        str(unit): (float(usd) if usd is not None else None)
        for unit, usd in value.items()
        if usd is None or (isinstance(usd, int | float) and not isinstance(usd, bool))
    }


def parse_gpu(uuid: str, fields: Mapping[str, str]) -> GpuRow:
    """A `gpu:{uuid}` hash as a row."""
    pods = _json(fields.get("pods"))
    return GpuRow(
        uuid=uuid,
        node=fields.get("node", ""),
        model=fields.get("model", ""),
        util_pct=_float(fields.get("util_pct")),
        mem_used_bytes=_int(fields.get("mem_used_bytes")),
        mem_total_bytes=_int(fields.get("mem_total_bytes")),
        owners=tuple(str(p) for p in pods) if isinstance(pods, list) else (),
        idle_since=_int(fields.get("idle_since")),
        updated_at=_int(fields.get("updated_at")),
        cluster=fields.get("cluster") or DEFAULT_CLUSTER,
    )


def parse_alert(fingerprint: str, raw: str) -> AlertRow | None:
    """One `alerts:firing` value (the alert message's JSON) as a row; None if unreadable."""
    doc = _json(raw)
    if not isinstance(doc, dict):
        return None
    subject = doc.get("subject")
    if not isinstance(subject, dict):
        subject = {}
    value = doc.get("value")
    labels = _labels(doc.get("labels"))
    return AlertRow(
        fingerprint=fingerprint,
        name=str(doc.get("name", "")),
        severity=str(doc.get("severity", "")),
        since=int(doc.get("since") or doc.get("ts") or 0),
        summary=str(doc.get("summary", "")),
        subject_kind=str(subject.get("kind", "")),
        subject_uid=_str(subject.get("uid")),
        subject_uuid=_str(subject.get("uuid")),
        subject_node=_str(subject.get("node")),
        labels=labels,
        value=float(value) if isinstance(value, int | float) else None,
        cluster=str(doc.get("cluster") or labels.get("cluster") or DEFAULT_CLUSTER),
    )


def pick_uids(
    lists: Mapping[str, Sequence[str]], order: Iterable[str], cap: int
) -> list[tuple[str, str]]:
    """Up to `cap` (state, uid) pairs, state sets in `order`, each newest first, no repeats.

    A pod moving between sets while they are read can show up in two lists: it counts once.
    """
    picked: list[tuple[str, str]] = []
    seen: set[str] = set()
    for state in order:
        for uid in lists.get(state, ()):
            if len(picked) == cap:
                return picked
            if uid not in seen:
                seen.add(uid)
                picked.append((state, uid))
    return picked


# -- Redis --------------------------------------------------------------------------------------


class Reader:
    """Reads one snapshot per call from the keys under one prefix."""

    def __init__(self, url: str, keys: RedisKeys, max_rows: int = MAX_ROWS) -> None:
        self.target = redact_url(url)
        self.keys, self.max_rows = keys, max_rows
        self._client = client.connect(
            url,
            decode_responses=True,
            timeout_s=SOCKET_TIMEOUT_S,
            connect_timeout_s=SOCKET_TIMEOUT_S,
            retries=0,  # the next refresh is the retry
        )

    def close(self) -> None:
        """Closes the connections."""
        self._client.close()

    def read(self, state: str | None = None) -> Snapshot:
        """The pods (of `state` only, if given), GPUs and firing alerts; TopUnavailable."""
        try:
            return self._read(state)
        except client.RedisError as err:
            reason = " ".join(str(err).split()) or type(err).__name__
            raise TopUnavailable(f"cannot read Redis at {self.target}: {reason}") from err

    def _read(self, state: str | None) -> Snapshot:
        keys, cap = self.keys, self.max_rows
        wanted = [s for s in READ_ORDER if state is None or s == state]
        pipe = self._client.pipeline(transaction=False)
        for each in STATES:
            pipe.zcard(keys.state(each))
        pipe.zcard(keys.gpus())
        pipe.hgetall(keys.alerts_firing())
        pipe.hgetall(keys.capacity())
        pipe.hgetall(keys.workloads())
        for each in wanted:
            pipe.zrevrange(keys.state(each), 0, cap - 1)
        pipe.zrevrange(keys.gpus(), 0, cap - 1)
        first: list[Any] = pipe.execute()
        counts: dict[str, int] = {s: int(n) for s, n in zip(STATES, first, strict=False)}
        gpus_total, firing = int(first[len(STATES)]), first[len(STATES) + 1]
        capacity: dict[str, str] = first[len(STATES) + 2]
        workloads: dict[str, str] = first[len(STATES) + 3]
        lists = dict(zip(wanted, first[len(STATES) + 4 : -1], strict=True))
        picked = pick_uids(lists, wanted, cap)
        gpu_uuids: list[str] = first[-1]

        pipe = self._client.pipeline(transaction=False)
        for _, uid in picked:
            pipe.hgetall(keys.pod(uid))
        for uuid in gpu_uuids:
            pipe.hgetall(keys.gpu(uuid))
        hashes: list[dict[str, str]] = pipe.execute() if picked or gpu_uuids else []
        pod_hashes = hashes[: len(picked)]
        pods = [parse_pod(uid, h) for (_, uid), h in zip(picked, pod_hashes, strict=True)]
        rows = tuple(p for p in pods if p is not None)
        gpus = tuple(parse_gpu(u, h) for u, h in zip(gpu_uuids, hashes[len(picked) :], strict=True))
        alerts = tuple(
            a for fp, raw in sorted(firing.items()) if (a := parse_alert(fp, raw)) is not None
        )
        names = {p.uid: p.name for p in rows}
        names.update(self._names(_unnamed(gpus, alerts, names)))
        return Snapshot(
            pods=rows,
            gpus=gpus,
            alerts=alerts,
            capacity=tuple(
                row for _, raw in sorted(capacity.items()) if (row := parse_capacity(raw))
            ),
            workloads=tuple(
                found for _, raw in sorted(workloads.items()) if (found := parse_workload(raw))
            ),
            pod_names=names,
            state_counts=counts,
            pods_left_out=max(0, sum(counts[each] for each in wanted) - len(picked)),
            gpus_total=gpus_total,
            gpus_left_out=max(0, gpus_total - len(gpu_uuids)),
            max_rows=cap,
        )

    def _names(self, uids: Sequence[str]) -> dict[str, str]:
        """`namespace/pod` of pods that were not read as rows (GPU owners, alert subjects)."""
        if not uids:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for uid in uids:
            pipe.hmget(self.keys.pod(uid), ["namespace", "pod"])
        found: list[list[str | None]] = pipe.execute()
        return {uid: f"{ns}/{pod}" for uid, (ns, pod) in zip(uids, found, strict=True) if pod}


def _unnamed(
    gpus: Iterable[GpuRow], alerts: Iterable[AlertRow], names: Mapping[str, str]
) -> list[str]:
    uids = {uid for g in gpus for uid in g.owners}
    uids |= {a.subject_uid for a in alerts if a.subject_kind == "pod" and a.subject_uid}
    return sorted(uids - names.keys())


# -- the loop -------------------------------------------------------------------------------------


def live(
    read: Callable[[], Snapshot],
    render: Callable[[Snapshot, int], RenderableType],
    first: Snapshot,
    out: TextIO,
    *,
    interval_s: float,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
    screen: Callable[[], terminal_size] = shutil.get_terminal_size,
) -> int:
    """Redraws every `interval_s` until Ctrl-C, then returns 0.

    On a terminal the view is `rich`'s full screen, each frame cut to its size, and the last
    frame is printed again when it ends (the prompt comes back below it); otherwise frames
    are printed one after another, plain. A failed read keeps the last rows and says so on
    top.
    """
    console = _terminal(out) if out.isatty() else None
    shown: Segments | None = None
    snapshot, error = first, ""
    try:
        with _screen(console) as on_screen:
            while True:
                view = render(snapshot, int(now() * 1000))
                if error:
                    warning = Text(f"! {error} (retrying every {interval_s:g}s)", no_wrap=True)
                    view = Group(warning, view)
                if console is not None and on_screen is not None:
                    size = screen()
                    console.size = (size.columns, size.lines)
                    hidden = view.hidden if isinstance(view, Frame) else 0
                    shown = fit_screen(console, view, size.columns, size.lines, hidden)
                    on_screen.update(shown, refresh=True)
                else:
                    out.write(plain(view) + "\n")
                    out.flush()
                sleep(interval_s)
                try:
                    snapshot, error = read(), ""
                except TopUnavailable as exc:
                    error = str(exc)
    except KeyboardInterrupt:
        if console is not None and shown is not None:
            console.print(shown, end="")
        return 0


def _screen_rows(out: TextIO) -> int | None:
    """The most table rows a frame can show: a screen's height on a terminal."""
    return shutil.get_terminal_size().lines if out.isatty() else None


def _terminal(out: TextIO) -> Console:
    """A console that styles (bold headers) and reads no markup or emoji codes in names."""
    return Console(file=out, force_terminal=True, highlight=False, markup=False, emoji=False)


def _screen(console: Console | None) -> AbstractContextManager[Live | None]:
    """The full screen of the live view on a terminal; nothing otherwise."""
    if console is None:
        return nullcontext()
    return Live(
        console=console,
        screen=True,
        auto_refresh=False,  # a frame is drawn when read, not on a timer thread
        redirect_stdout=False,
        redirect_stderr=False,
    )


def run(
    settings: RedisSettings,
    options: TopOptions,
    out: TextIO,
    *,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """`gpuwatch top`: 0 when shown; TopUnavailable when Redis cannot be read at start."""
    url = settings.url.get_secret_value()
    reader = Reader(url, RedisKeys(options.key_prefix), options.max_rows)
    header, query = Header(target=reader.target, prefix=options.key_prefix), options.query
    try:
        if options.once or options.json:
            fmt = render_json if options.json else render_text
            out.write(fmt(reader.read(query.state), query, header, int(now() * 1000)))
            out.flush()
            return 0
        try:
            first = reader.read(query.state)
        except KeyboardInterrupt:
            return 0  # Ctrl-C before the first frame ends the view as quietly as after it
        return live(
            lambda: reader.read(query.state),
            lambda snapshot, at: frame(snapshot, query, header, at, _screen_rows(out)),
            first,
            out,
            interval_s=options.interval_s,
            now=now,
            sleep=sleep,
        )
    finally:
        reader.close()
