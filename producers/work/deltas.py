"""Increases of counters between two scrapes of a pod, through resets and restarts.

The rules, per pod (by uid) and unit:

- The first scrape of a pod is a baseline: it was running before, for how long is not
  known, so its counters say nothing of the interval. No increase is reported.
- A value at or above the previous one: the increase is the difference.
- A value below the previous one is a reset, as Prometheus' `increase()` takes it: the
  counter started again from zero, so the increase is the new value. A counter has no
  other way down; a gauge named by mistake would count its rises only.
- A new `process_start_time_seconds` is a restart: every unit counts from zero, even
  one now above its previous value (the new process did all of it).
- A unit seen for the first time on a pod already scraped counts from zero: its series
  appeared in the interval (vLLM creates labelled series at the first request).
- A unit missing from a scrape keeps its last value, so a series that disappears for a
  while and comes back is not counted twice.
- A failed scrape is not observed: the last good values stay the baseline and the next
  good scrape covers the whole gap.
- A pod restarted under a new uid is a new pod (a baseline). `forget` drops a pod gone.

A reset between two scrapes loses what was counted before it within the interval; a
reset hidden by a value already back above the previous one, with no process start to
tell it, is counted as the difference. Both are the limits of sampling a counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["CounterDeltas", "Increase"]


class Increase(NamedTuple):
    """Units done since the pod's previous observation."""

    units: dict[str, float]
    """Unit name -> increase (>= 0), for every unit of the observation."""
    resets: tuple[str, ...]
    """Units counted from zero after a reset or a restart, sorted."""


@dataclass
class _Pod:
    values: dict[str, float] = field(default_factory=dict)
    start_time: float | None = None


class CounterDeltas:
    """The last values of each pod's counters (not thread-safe: one scraper owns it)."""

    def __init__(self) -> None:
        self._pods: dict[str, _Pod] = {}

    def __contains__(self, uid: object) -> bool:
        return uid in self._pods

    def __len__(self) -> int:
        return len(self._pods)

    def uids(self) -> frozenset[str]:
        """The pods with a baseline."""
        return frozenset(self._pods)

    def observe(
        self, uid: str, values: Mapping[str, float], start_time: float | None
    ) -> Increase | None:
        """The increase since the pod's previous observation; None for its first (the
        baseline). `values`: unit -> counter value now; `start_time`: its process's
        `process_start_time_seconds`, None when not exposed."""
        previous = self._pods.get(uid)
        if previous is None:
            self._pods[uid] = _Pod(dict(values), start_time)
            return None
        restarted = (
            start_time is not None
            and previous.start_time is not None
            and start_time != previous.start_time
        )
        units: dict[str, float] = {}
        resets: list[str] = []
        for unit, value in values.items():
            last = previous.values.get(unit)
            if last is None:
                units[unit] = value
            elif restarted or value < last:
                units[unit] = value
                resets.append(unit)
            else:
                units[unit] = value - last
            previous.values[unit] = value
        if start_time is not None:
            previous.start_time = start_time
        return Increase(units, tuple(sorted(resets)))

    def forget(self, uid: str) -> None:
        """Drop a pod (gone, or no longer opted in); seen again, it starts with a baseline."""
        self._pods.pop(uid, None)
