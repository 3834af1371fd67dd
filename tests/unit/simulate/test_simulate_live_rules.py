"""The rules of a simulation on a real API server that need no server: when the watcher has
seen the last writes, which status times move up to the server's creation time, and the
node agents naming pods by the uids the server gave them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.kube.live import not_before
from gpuwatch.harness.simulate.loop import SimClock, Simulation
from gpuwatch.harness.simulate.runner import caught_up
from gpuwatch.harness.simulate.scenario import load_scenario
from schemas import NVML_SAMPLES

EPOCH = 1_764_400_000


@pytest.mark.parametrize(
    ("positions", "written", "expected"),
    [
        ([("pods", "120"), ("nodes", "40")], {"pods": 120, "nodes": 40}, True),
        ([("pods", "130"), ("nodes", "40")], {"pods": 120, "nodes": 40}, True),  # moved on
        ([("pods", "119"), ("nodes", "40")], {"pods": 120, "nodes": 40}, False),
        # The pods' last write was after the nodes' last: the node watch need not see it.
        ([("pods", "120"), ("nodes", "40")], {"pods": 120, "nodes": 40, "jobs": 500}, True),
        ([("pods", None), ("nodes", "40")], {"pods": 120}, False),  # relisting
        ([("pods", None)], {}, True),  # nothing written, nothing to wait for
        ([("pods", "9"), ("pods", "120")], {"pods": 120}, False),  # every pod watch
        ([("pods", "1000")], {"pods": 999}, True),  # numbers, not text ("1000" < "999")
    ],
)
def test_the_watcher_has_caught_up_when_each_watch_saw_its_resources_last_write(
    positions: list[tuple[str, str | None]], written: dict[str, int], expected: bool
) -> None:
    assert caught_up(positions, written) is expected


def test_status_times_before_the_creation_move_up_to_it_and_later_ones_stay() -> None:
    created = "2025-11-29T10:00:00Z"
    status: dict[str, Any] = {
        "phase": "Running",
        "startTime": "2025-11-28T10:00:00Z",  # a day before: the scenario's past
        "conditions": [
            {"type": "PodScheduled", "lastProbeTime": None, "lastTransitionTime": created},
            {"type": "Ready", "lastTransitionTime": "2025-11-29T10:00:05Z"},
        ],
        "containerStatuses": [
            {
                "name": "main",
                "state": {"running": {"startedAt": "2025-11-29T09:59:59Z"}},
                "lastState": {"terminated": {"finishedAt": "2025-11-29T09:00:00Z"}},
                "image": "2025-01-01T00:00:00Z",  # not a time field: text stays as it is
            }
        ],
    }

    fixed = not_before(status, datetime(2025, 11, 29, 10, tzinfo=UTC), created)

    assert fixed["startTime"] == created
    assert fixed["conditions"][0] == status["conditions"][0]
    assert fixed["conditions"][1]["lastTransitionTime"] == "2025-11-29T10:00:05Z"
    container = fixed["containerStatuses"][0]
    assert container["state"]["running"]["startedAt"] == created
    assert container["lastState"]["terminated"]["finishedAt"] == created
    assert container["image"] == "2025-01-01T00:00:00Z"
    assert status["startTime"] == "2025-11-28T10:00:00Z"  # the given status is left alone


class RenamingApi(FakeApiServer):
    """A server that picks its own pod uids, as a real one does."""

    def create(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        if resource == "pods":
            obj = dict(obj, metadata={**obj["metadata"], "uid": "server-" + obj["metadata"]["uid"]})
        return super().create(resource, obj)


def test_the_node_agents_name_pods_by_the_uids_the_server_gave_them() -> None:
    published: list[bytes] = []
    clock = SimClock(EPOCH)
    api = RenamingApi(clock=clock.time)
    simulation = Simulation(
        load_scenario("small"),
        api=api,
        publish_for=lambda _node: lambda _key, value: published.append(value),
        interval_s=1.0,
        clock=clock,
    )
    simulation.prepare()
    for _ in range(6):
        simulation.tick()

    samples = [NVML_SAMPLES.decode(value) for value in published]
    allocated = {a.pod_uid for s in samples for a in s.allocations}
    processes = {p.pod_uid for s in samples for g in s.gpus for p in g.processes if p.pod_uid}
    server_uids = {pod["metadata"]["uid"] for pod in api.objects("pods")}
    assert len(allocated) == 8  # every pod holding a GPU by t=6 s
    assert allocated <= server_uids
    assert processes
    assert processes <= server_uids
    assert all(uid.startswith("server-") for uid in server_uids)
