"""`gpuwatch simulate --cluster`: the name reaches the simulated cluster's real producers, so
two simulations of one scenario publish the same node names under two clusters."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuwatch.cli.main import main
from gpuwatch.config import load_settings
from gpuwatch.harness.run.simulate import SimulateOptions
from gpuwatch.harness.simulate.kube.apiserver import FakeApiServer
from gpuwatch.harness.simulate.runner import SimulationService
from gpuwatch.harness.simulate.scenario import load_scenario
from producers.base.kubeapi import Collection, WatchLines
from producers.base.publisher import Done, MessageSender
from schemas import K8S_NODES, K8S_PODS, K8S_WORKLOADS, NVML_SAMPLES, WORK_UNITS
from schemas.settings import Settings

EPOCH = 1_764_400_000  # 2025-11-29 07:06:40 UTC
TOPICS = {
    spec.name: spec for spec in (NVML_SAMPLES, K8S_PODS, K8S_NODES, K8S_WORKLOADS, WORK_UNITS)
}


@dataclass
class Recorder:
    """A MessageSender that keeps what it is given and acknowledges at once."""

    messages: list[tuple[bytes, bytes]] = field(default_factory=list)

    def send(self, key: bytes, value: bytes, done: Done) -> None:
        self.messages.append((key, value))
        done(None)

    def flush(self, timeout_s: float) -> None:
        """Nothing is held."""

    def close(self, timeout_s: float) -> None:
        """Nothing to release."""


@dataclass
class Recorders:
    """One Recorder per topic, by the topic's short name."""

    by_topic: dict[str, Recorder] = field(default_factory=dict)

    def __call__(self, topic: str, client_id: str) -> MessageSender:
        short = next(name for name in TOPICS if topic.endswith(name))
        return self.by_topic.setdefault(short, Recorder())


class StoreApi:
    """Lists what the in-process API server holds, without serving it over HTTP."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    def list(self, collection: Collection, *, limit: int, continue_token: str | None) -> bytes:
        meta = {"resourceVersion": self.server.resource_version}
        items = self.server.objects(collection.resource)
        return json.dumps({"kind": "List", "metadata": meta, "items": items}).encode()

    def watch(self, collection: Collection, *, resource_version: str, timeout_s: int) -> WatchLines:
        raise AssertionError("only the first list is taken")

    def get_controller(self, kind: str, namespace: str, name: str) -> bytes | None:
        return None


def first_second(settings: Settings) -> dict[str, list[tuple[bytes, Any]]]:
    """(key, decoded JSON) of every message of the first simulated second of `small`, by
    topic: the nodes' first samples and the watcher's first lists."""
    recorders = Recorders()
    service = SimulationService(settings, load_scenario("small"), epoch_s=EPOCH, senders=recorders)
    service.simulation.prepare()
    service.simulation.tick()
    watcher = service.watcher_over(StoreApi(service.api))
    for watch in watcher.watches:
        assert watch.step()
    assert service.samples.step() is None
    for publisher in service.publishers.values():
        publisher.step()
    return {
        name: [(key, json.loads(value)) for key, value in recorders.by_topic[name].messages]
        for name in TOPICS
    }


def cluster_settings(name: str | None) -> Settings:
    return load_settings(env={}, overrides={} if name is None else {"cluster.name": name})


def test_every_message_of_a_named_simulated_cluster_names_it() -> None:
    published = first_second(cluster_settings("eu-west"))

    assert published.pop(K8S_WORKLOADS.name) == []  # small queues nothing in Kueue
    assert published.pop(WORK_UNITS.name) == []  # the first scrape is at 15 s
    for name, messages in published.items():
        assert messages, name
        assert {message.get("cluster") for _, message in messages} == {"eu-west"}, name


def test_the_default_simulated_cluster_leaves_the_field_out() -> None:
    published = first_second(cluster_settings(None))

    assert published.pop(K8S_WORKLOADS.name) == []  # small queues nothing in Kueue
    assert published.pop(WORK_UNITS.name) == []  # the first scrape is at 15 s
    for name, messages in published.items():
        assert messages, name
        assert all("cluster" not in message for _, message in messages), name


def test_two_simulations_publish_the_same_nodes_under_two_clusters() -> None:
    west = first_second(cluster_settings("eu-west"))
    east = first_second(cluster_settings("us-east"))

    def nodes(published: dict[str, list[tuple[bytes, Any]]]) -> set[tuple[str, str]]:
        return {
            (message["cluster"], message["node"])
            for topic in ("nvml.samples", "k8s.nodes")
            for _, message in published[topic]
        }

    west_nodes, east_nodes = nodes(west), nodes(east)
    assert {node for _, node in west_nodes} == {node for _, node in east_nodes}
    assert len(west_nodes) > 1
    assert not west_nodes & east_nodes  # (cluster, node) tells them apart
    # Node names are the keys of both; pod uids and GPU uuids are each cluster's own, as
    # real ones are, while the pods' names follow the scenario in both.
    for topic in ("nvml.samples", "k8s.nodes"):
        assert [key for key, _ in west[topic]] == [key for key, _ in east[topic]], topic
    west_pods = {key: m["name"] for key, m in west["k8s.pods"]}
    east_pods = {key: m["name"] for key, m in east["k8s.pods"]}
    assert not west_pods.keys() & east_pods.keys()
    assert sorted(west_pods.values()) == sorted(east_pods.values())

    def uuids(published: dict[str, list[tuple[bytes, Any]]]) -> set[str]:
        return {g["uuid"] for _, m in published["nvml.samples"] for g in m["gpus"]}

    assert uuids(west)
    assert not uuids(west) & uuids(east)


def test_the_flag_reaches_the_simulation_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gpuwatch.harness.run.simulate

    seen: list[Settings] = []
    kube: list[bool] = []

    def run(settings: Settings, options: SimulateOptions, _progress: object) -> int:
        seen.append(settings)
        kube.append(options.kube)
        return 0

    monkeypatch.setattr(gpuwatch.harness.run.simulate, "run", run)
    monkeypatch.setenv("GPUWATCH_CLUSTER", "from-env")

    assert main(["simulate", "--no-topic-check"]) == 0
    assert main(["simulate", "--cluster", "eu-west", "--no-topic-check", "--kube"]) == 0

    assert [s.cluster.name for s in seen] == ["from-env", "eu-west"]
    assert kube == [False, True]


def test_a_bad_cluster_flag_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--cluster", "eu west"])

    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --cluster: 'eu west' is not a cluster name" in err
