"""Property: for any sequence of API changes and any pattern of dropped watches, 410s and
API errors, what the watcher publishes converges to the API's final state, and carries
every state change a consumer needs.

Each example runs the real watcher, through the real `kubernetes` client, against the
test API server. The expected values come from normalising the server's objects after
each change, so this tests the list/watch/resync machinery, not the normalisation
(tested on recorded objects elsewhere).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import wait_until
from support.fake_apiserver import FakeApiServer

from gpuwatch.harness.simulate.kube import manifests as m
from producers.k8s.client import KubernetesApi
from producers.k8s.normalise import NodeRules, PodRules, normalise_node, normalise_pod
from producers.k8s.objects import NODE_DECODER, POD_DECODER
from producers.k8s.resync import content
from producers.k8s.selection import GpuResources
from producers.k8s.watcher import K8sWatcher
from producers.k8s.watching import Backoff
from schemas import K8sNode, K8sPod
from schemas.settings import WatcherSettings

SETTINGS = WatcherSettings()
GPUS = GpuResources.of(SETTINGS.gpu_resources, SETTINGS.gpu_resource_prefixes)
POD_RULES = PodRules(GPUS, SETTINGS.pod_label_allowlist)
NODE_RULES = NodeRules(GPUS, SETTINGS.node_label_allowlist)
POD_STEPS = [
    "bound",
    "pulling",
    "image",
    "running",
    "crash",
    "succeeded",
    "failed",
    "evicted",
    "label",
    "churn",
    "terminating",
]
NODE_STEPS = ["create", "ready", "not-ready", "cordon", "uncordon", "delete"]
EXPIRING = {"expire", "compact-drop"}  # ops after which intermediate states may be lost

pod_id = st.integers(0, 2)  # few pods, so that changes pile up on the same ones
change = st.one_of(
    st.tuples(st.just("create"), pod_id, st.sampled_from([True, True, True, False])),
    st.tuples(st.just("advance"), pod_id, st.sampled_from(POD_STEPS)),
    st.tuples(st.just("advance"), pod_id, st.sampled_from(POD_STEPS)),
    st.tuples(st.just("delete"), pod_id),
    st.tuples(st.just("node"), st.integers(0, 2), st.sampled_from(NODE_STEPS)),
)
DISRUPTIONS = ["none", "drop", "expire", "compact-drop", "fail"]
# A round: some changes, perhaps the watcher catching up (so what it saw before the
# disruption is replayed or not), then a disruption of its watches.
rounds = st.lists(
    st.tuples(
        st.lists(change, min_size=1, max_size=4), st.booleans(), st.sampled_from(DISRUPTIONS)
    ),
    min_size=1,
    max_size=6,
)
initial = st.lists(pod_id, min_size=1, max_size=3, unique=True)  # GPU pods before the start


@dataclass
class Model:
    """The test's own account: which pods exist, every state each key went through."""

    server: FakeApiServer
    clock: float = field(default_factory=lambda: time.time() - 3600)
    pods: dict[int, tuple[str, str, bool]] = field(default_factory=dict)  # id -> name, uid, gpu
    generation: int = 0
    states: dict[str, list[Any]] = field(default_factory=dict)  # key -> contents, in order

    def tick(self) -> float:
        self.clock += 1
        return self.clock

    def record_pod(self, pid: int) -> None:
        name, uid, gpu = self.pods[pid]
        obj = self.server.get("pods", "ml", name)
        if gpu and obj is not None:
            value = normalise_pod(POD_DECODER.decode(json.dumps(obj)), POD_RULES, None)
            self.states.setdefault(uid, []).append(content(value))

    def record_node(self, name: str) -> None:
        obj = self.server.get("nodes", None, name)
        if obj is not None:
            value = normalise_node(NODE_DECODER.decode(json.dumps(obj)), NODE_RULES)
            self.states.setdefault(name, []).append(content(value))

    def create(self, pid: int, gpu: bool) -> None:
        if pid in self.pods:
            return
        self.generation += 1
        name = f"p{pid}-{self.generation}"
        pod = m.gpu_pod(name, "ml", created=self.tick(), labels={"team": "a"})
        if not gpu:
            pod["spec"]["containers"][0]["resources"] = {}
        created = self.server.create("pods", pod)
        self.pods[pid] = (name, created["metadata"]["uid"], gpu)
        self.record_pod(pid)

    def advance(self, pid: int, step: str) -> None:
        if pid not in self.pods:
            return
        name = self.pods[pid][0]
        current = self.server.get("pods", "ml", name)
        assert current is not None
        at = self.tick()
        node = current["spec"].get("nodeName") or "gpu-node-0"
        steps: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "bound": lambda p: m.bound(p, node, at),
            "pulling": lambda p: m.pulling(m.bound(p, node, at), at),
            "image": lambda p: m.image_pull_backoff(m.bound(p, node, at), at),
            "running": lambda p: m.running(m.bound(p, node, at), at),
            "crash": lambda p: m.crash_looping(m.bound(p, node, at), at),
            "succeeded": lambda p: m.succeeded(m.bound(p, node, at), at),
            "failed": lambda p: m.failed(
                m.bound(p, node, at), at, reason="OOMKilled", exit_code=137
            ),
            "evicted": lambda p: m.evicted(p, at),
            "label": lambda p: {
                **p,
                "metadata": {**p["metadata"], "labels": {"team": f"t{int(at) % 3}"}},
            },
            "churn": lambda p: {**p, "status": {**p["status"], "podIP": f"10.0.0.{int(at) % 250}"}},
            "terminating": lambda p: m.terminating(p, at),
        }
        self.server.update("pods", steps[step](current))
        self.record_pod(pid)

    def delete(self, pid: int) -> None:
        if pid in self.pods:
            name, _, _ = self.pods.pop(pid)
            self.server.delete("pods", "ml", name)

    def node(self, nid: int, step: str) -> None:
        name = f"gpu-node-{nid}"
        current = self.server.get("nodes", None, name)
        at = self.tick()
        if step == "create":
            if current is None:
                self.server.create("nodes", m.gpu_node(name, created=at))
        elif current is None:
            return
        elif step == "delete":
            self.server.delete("nodes", None, name)
            return
        else:
            self.server.update(
                "nodes",
                {
                    "ready": lambda n: m.node_ready(n, True, at),
                    "not-ready": lambda n: m.node_ready(n, False, at),
                    "cordon": lambda n: m.cordoned(n, at),
                    "uncordon": lambda n: m.cordoned(n, at, on=False),
                }[step](current),
            )
        self.record_node(name)

    def final(self) -> dict[str, Any]:
        """key -> content of every published object that exists now."""
        out = {}
        for _, uid, gpu in self.pods.values():
            if gpu:
                out[uid] = self.states[uid][-1]
        for node in self.server.objects("nodes"):
            name = node["metadata"]["name"]
            out[name] = self.states[name][-1]
        return out


class Published:
    """Everything the watcher published, per key, in order."""

    def __init__(self) -> None:
        self.messages: dict[str, list[K8sPod | K8sNode]] = {}
        self.lock = threading.Lock()

    def pod(self, value: K8sPod) -> None:
        with self.lock:
            self.messages.setdefault(value.uid, []).append(value)

    def node(self, value: K8sNode) -> None:
        with self.lock:
            self.messages.setdefault(value.node, []).append(value)

    def view(self) -> dict[str, Any]:
        """What a consumer folding the stream believes now."""
        with self.lock:
            return {
                key: content_of(messages[-1])
                for key, messages in self.messages.items()
                if messages[-1].type != "DELETED"
            }


def content_of(value: K8sPod | K8sNode) -> object:
    """`content` of either kind of value."""
    if isinstance(value, K8sPod):
        return content(value)
    return content(value)  # the type variable is resolved per branch


def wait_for(predicate: Callable[[], object], what: str, timeout_s: float = 15.0) -> None:
    wait_until(predicate, timeout_s=timeout_s, what=what, interval_s=0.005)


def dedup(states: list[Any]) -> list[Any]:
    return [s for i, s in enumerate(states) if i == 0 or s != states[i - 1]]


def is_subsequence(short: list[Any], long: list[Any]) -> bool:
    remaining = iter(long)
    return all(any(item == candidate for candidate in remaining) for item in short)


@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(initial=initial, rounds=rounds, bookmarks=st.booleans())
# Seen by the watcher, then lost with the connection: resumed, replayed, not repeated.
@example(
    initial=[0],
    rounds=[
        ([("advance", 0, "running"), ("advance", 0, "label")], True, "drop"),
        ([("advance", 0, "crash")], True, "none"),
    ],
    bookmarks=False,
)
# Changed, deleted and created while the watch was lost and compacted away.
@example(
    initial=[0, 1],
    rounds=[
        ([("advance", 0, "running")], True, "none"),
        ([("advance", 0, "succeeded"), ("delete", 1), ("create", 2, True)], False, "compact-drop"),
        ([("advance", 2, "running")], False, "fail"),
    ],
    bookmarks=True,
)
def test_published_events_converge_with_every_transition(
    initial: list[int],
    rounds: list[tuple[list[tuple[Any, ...]], bool, str]],
    bookmarks: bool,
) -> None:
    published = Published()
    # Without bookmarks (the real server sends one a minute) a watch resumes from the
    # version of the last change it saw; with them, from a later one.
    with FakeApiServer(bookmark_interval_s=0.05 if bookmarks else None) as server:
        model = Model(server)
        for pid in initial:
            model.create(pid, True)
        model.node(0, "create")
        before = set(model.states)
        api = KubernetesApi.for_host(server.url)
        watcher = K8sWatcher(
            api,
            SETTINGS,
            emit_pod=published.pod,
            emit_node=published.node,
            backoff=Backoff(base_s=0.005, cap_s=0.02, rng=random.Random(1)),
            watch_timeout_s=30,
            resolve_owners=False,
        )
        watcher.start()
        try:
            wait_for(lambda: watcher.synced, "the first lists")
            for changes, settle, disruption in rounds:
                for kind, *args in changes:
                    getattr(model, kind)(*args)
                if settle:
                    wait_for(lambda: published.view() == model.final(), "the watcher to catch up")
                if disruption == "drop":
                    server.drop_watches()
                elif disruption == "expire":
                    server.expire_watches()
                elif disruption == "compact-drop":
                    server.drop_watches()
                    server.compact()
                elif disruption == "fail":
                    server.fail_next(2)
                    server.drop_watches()
            wait_for(lambda: published.view() == model.final(), "convergence")
        finally:
            watcher.stop()
            api.close()

    lossy = any(disruption in EXPIRING for _, _, disruption in rounds)
    for key, messages in published.messages.items():
        kinds = [message.type for message in messages]
        # Never anything after DELETED; an object gone at the end was said to be gone.
        assert "DELETED" not in kinds[:-1], (key, kinds)
        assert (kinds[-1] == "DELETED") == (key not in model.final()), (key, kinds)
        # Event time never goes back for a key.
        stamps = [message.ts for message in messages]
        assert stamps == sorted(stamps), (key, stamps)
        # New to consumers: RESYNC if it existed when the watcher started, else ADDED.
        assert kinds[0] == ("RESYNC" if key in before else "ADDED"), (key, kinds)
        # Published only on change; DELETED repeats the last state it was known in.
        for previous, message in itertools.pairwise(messages):
            if message.type == "DELETED":
                assert content_of(message) == content_of(previous), key
            else:
                assert content_of(message) != content_of(previous), (key, kinds)
        # Every state a consumer saw happened, in order; without a 410 none was missed.
        seen = [content_of(message) for message in messages if message.type != "DELETED"]
        expected = dedup(model.states[key])
        assert is_subsequence(seen, expected), key
        if not lossy:
            assert seen == expected, (key, kinds)
            assert kinds.count("RESYNC") == (1 if key in before else 0), (key, kinds)
    # Every wanted object was published, but one that lived and died inside a 410 gap.
    assert set(published.messages) <= set(model.states)
    if not lossy:
        assert set(published.messages) == set(model.states), "a wanted object was never published"
