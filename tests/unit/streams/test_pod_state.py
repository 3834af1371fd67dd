"""The stored pod state: JSON round trips and tolerance of other worker versions."""

from __future__ import annotations

import json

from test_pod_fixtures import RULES, UID, WINDOWS, pod, usage

from streams.core.pod.pod_state import PodState, decode, encode, new_state
from streams.core.pod.pod_step import step_pod_event, step_usage


def busy_state() -> PodState:
    """A state with every group of fields set: metadata, history, windows, alert flags."""
    state, _ = step_pod_event(None, pod("Running", ts=0, rv=1), RULES, WINDOWS)
    state, _ = step_usage(state, usage(0, 400_000, idle_since=0), RULES, WINDOWS)
    return state


def test_round_trips() -> None:
    state = busy_state()
    assert state.state == "stalled"
    assert state.stalled_alert_since == 0
    assert state.windows
    assert decode(encode(state)) == state
    assert PodState.from_dict(state.to_dict()) == state
    assert json.loads(encode(state))["owner"] == {"kind": "Job", "name": "train"}


def test_an_older_or_newer_workers_state_decodes() -> None:
    data = new_state(UID).to_dict()
    data["field_of_a_newer_worker"] = 1
    del data["stalled_alert_since"]  # written before the field existed
    state = PodState.from_dict(data)
    assert state == new_state(UID)
