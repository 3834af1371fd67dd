"""Fleet capacity worked by hand: free GPUs, fragmentation, stranded and reclaimable GPUs."""

from __future__ import annotations

import random
from typing import Any

from capacity_reference import reference_assess
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.core.fleet.capacity import IdleGpu, NodeCapacity, QueuedPod, assess

GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"
T0 = 1_764_400_000_000
MIN = 60_000


def node(name: str, free: int, *, total: int = 8, model: str = H100, **kw: Any) -> NodeCapacity:
    """A node of `total` GPUs with `free` of them unallocated."""
    return NodeCapacity(
        node=name, allocatable={GPU: total}, allocated={GPU: total - free}, model=model, **kw
    )


def queued(
    name: str, gpus: int, *, models: tuple[str, ...] | None = (H100,), **kw: Any
) -> QueuedPod:
    return QueuedPod(
        uid=f"uid-{name}", namespace="ml", pod=name, request={GPU: gpus}, since=T0,
        models=models, **kw,
    )  # fmt: skip


def fleet(nodes: list[NodeCapacity], pods: list[QueuedPod], now: int = T0) -> Any:
    return assess(nodes, pods, now_ms=now, idle_after_ms=MIN)


def test_a_request_the_fleet_covers_but_no_node_is_blocked_by_fragmentation() -> None:
    # 6 H100 free: one or two on each of four nodes; a pod asks for 4.
    nodes = [node("a", 1), node("b", 2), node("c", 2), node("d", 1)]
    result = fleet(nodes, [queued("big", 4)])
    (blocked,) = result.blocked
    assert (blocked.pod.pod, blocked.wanted, blocked.best_node, blocked.best_free) == (
        "big",
        4,
        "b",  # the first by name of the two with 2 free
        2,
    )
    assert blocked.fleet_free == 6
    (h100,) = result.models
    assert (h100.model, h100.free, h100.stranded) == (H100, 6, 6)
    assert result.free[("default", "b")] == {GPU: 2}


def test_an_l40s_free_does_not_unblock_an_h100_request() -> None:
    nodes = [node("a", 1), node("b", 1), node("l", 4, model=L40S)]
    result = fleet(nodes, [queued("big", 2)])
    (blocked,) = result.blocked
    assert (blocked.fleet_free, blocked.best_free) == (2, 1)  # the L40S' 4 are not counted
    stranded = {m.model: (m.free, m.stranded) for m in result.models}
    assert stranded == {H100: (2, 2), L40S: (4, 0)}  # no queued pod could use the L40S
    # A pod that allows any model fits the L40S node: not blocked, nothing stranded there.
    result = fleet(nodes, [queued("any", 2, models=None)])
    assert result.blocked == ()
    assert {m.model: m.stranded for m in result.models} == {H100: 2, L40S: 0}


def test_too_few_free_gpus_is_a_shortage_not_fragmentation() -> None:
    result = fleet([node("a", 1), node("b", 2)], [queued("big", 4)])
    assert result.blocked == ()
    assert result.models[0].stranded == 3  # demand none of it fits


def test_a_pod_that_fits_a_node_is_not_blocked_and_strands_nothing_there() -> None:
    result = fleet([node("a", 1), node("b", 4)], [queued("two", 2)])
    assert result.blocked == ()
    assert result.models[0].stranded == 1  # a's one GPU: the pod fits b, not a


def test_cordoned_and_not_ready_nodes_have_nothing_free() -> None:
    nodes = [node("a", 2), node("b", 2, schedulable=False)]
    result = fleet(nodes, [queued("big", 4)])
    assert result.blocked == ()  # 2 usable free: a shortage
    assert result.free[("default", "b")] == {GPU: 0}


def test_a_mig_request_counts_only_mig_devices_of_its_profile() -> None:
    mig = NodeCapacity(node="m", allocatable={MIG: 7, GPU: 1}, allocated={MIG: 5}, model=H100)
    whole = node("a", 4)
    pod = QueuedPod(uid="u", namespace="ml", pod="small", request={MIG: 3}, since=T0)
    result = fleet([mig, whole], [pod])
    assert result.blocked == ()  # 2 MIG devices free in all: a shortage; GPUs do not count
    by = {(m.model, m.resource): (m.free, m.stranded) for m in result.models}
    assert by == {(H100, GPU): (5, 0), (H100, MIG): (2, 2)}


def test_nodes_of_another_cluster_do_not_count() -> None:
    nodes = [node("a", 2), node("b", 2), node("a", 4, cluster="east")]
    result = fleet(nodes, [queued("big", 4)])
    (blocked,) = result.blocked
    assert (blocked.fleet_free, blocked.best_node) == (4, "a")
    assert result.free[("east", "a")] == {GPU: 4}
    east = fleet(nodes, [queued("big", 4, cluster="east")])
    assert east.blocked == ()


def test_idle_allocated_gpus_are_reclaimable_while_a_matching_pod_queues() -> None:
    old = IdleGpu("GPU-old", GPU, T0 - 30 * MIN, ("research/notebook-0",))
    new = IdleGpu("GPU-new", GPU, T0 - 2 * MIN, ("ml/idle-job-0",))
    short = IdleGpu("GPU-short", GPU, T0 - 30_000, ("ml/eval-0",))
    l40s = IdleGpu("GPU-l40s", GPU, T0 - 60 * MIN, ("dev/dev-1",))
    nodes = [
        node("a", 0, idle=(new, short)),
        node("b", 1, idle=(old,)),
        node("l", 0, model=L40S, idle=(l40s,)),
    ]
    result = fleet(nodes, [queued("big", 2)])
    h100 = next(m for m in result.models if m.model == H100)
    # Longest idle first; idle under the threshold (30 s) is not reclaimable yet.
    assert [(n, g.uuid, g.pods) for n, g in h100.reclaimable] == [
        ("b", "GPU-old", ("research/notebook-0",)),
        ("a", "GPU-new", ("ml/idle-job-0",)),
    ]
    l40s_model = next(m for m in result.models if m.model == L40S)
    assert l40s_model.reclaimable == ()  # no queued pod could use an L40S
    assert all(m.reclaimable == () for m in fleet(nodes, []).models)  # nothing queues


def test_a_node_without_the_product_label_is_of_model_unknown() -> None:
    result = fleet([NodeCapacity(node="x", allocatable={GPU: 2})], [queued("any", 4, models=None)])
    assert [(m.model, m.free) for m in result.models] == [("unknown", 2)]
    # A pod asking for a model never fits a node whose model is not known.
    assert fleet([NodeCapacity(node="x", allocatable={GPU: 8})], [queued("h", 1)]).blocked == ()


nodes_st = st.lists(
    st.builds(
        node,
        st.sampled_from(["a", "b", "c", "d"]),
        st.integers(0, 8),
        model=st.sampled_from([H100, L40S]),
        schedulable=st.booleans(),
    ),
    max_size=4,
    unique_by=lambda n: n.node,
)
pods_st = st.lists(
    st.builds(
        queued,
        st.sampled_from(["p", "q", "r"]),
        st.integers(1, 8),
        models=st.sampled_from([(H100,), (L40S,), None]),
    ),
    max_size=3,
    unique_by=lambda p: p.uid,
)


@settings(max_examples=300, deadline=None)
@given(nodes_st, pods_st, st.randoms(use_true_random=False))
def test_the_answer_is_the_same_in_any_order_and_blocked_means_no_node_fits(
    nodes: list[NodeCapacity], pods: list[QueuedPod], rng: random.Random
) -> None:
    result = fleet(nodes, pods)
    shuffled_nodes, shuffled_pods = nodes[:], pods[:]
    rng.shuffle(shuffled_nodes)
    rng.shuffle(shuffled_pods)
    assert fleet(shuffled_nodes, shuffled_pods) == result
    for blocked in result.blocked:
        assert not any(blocked.pod.fits(n) for n in nodes)
        assert blocked.fleet_free >= blocked.wanted > blocked.best_free
    for model in result.models:
        assert 0 <= model.stranded <= model.free


multi_nodes_st = st.lists(
    st.builds(
        NodeCapacity,
        node=st.sampled_from(["a", "b", "c", "d", "e"]),
        allocatable=st.dictionaries(st.sampled_from([GPU, MIG]), st.integers(0, 4), max_size=2),
        allocated=st.dictionaries(st.sampled_from([GPU, MIG]), st.integers(0, 4), max_size=2),
        model=st.sampled_from([H100, L40S, None]),
        schedulable=st.booleans(),
        idle=st.lists(
            st.builds(
                IdleGpu,
                uuid=st.sampled_from(["GPU-1", "GPU-2"]),
                resource=st.sampled_from([GPU, MIG]),
                since=st.integers(T0 - 2 * MIN, T0),
                pods=st.just(("ml/x",)),
            ),
            max_size=2,
        ).map(tuple),
        cluster=st.sampled_from(["default", "east"]),
    ),
    max_size=5,
    unique_by=lambda n: (n.cluster, n.node),
)
multi_pods_st = st.lists(
    st.builds(
        QueuedPod,
        uid=st.sampled_from(["p", "q", "r", "s"]),
        namespace=st.just("ml"),
        pod=st.just("x"),
        request=st.dictionaries(st.sampled_from([GPU, MIG]), st.integers(1, 6), max_size=2),
        since=st.integers(T0 - MIN, T0),
        models=st.sampled_from([(H100,), (L40S,), (H100, L40S), None]),
        cluster=st.sampled_from(["default", "east"]),
    ),
    max_size=4,
    unique_by=lambda p: p.uid,
)


@settings(max_examples=500, deadline=None)
@given(multi_nodes_st, multi_pods_st)
def test_the_grouped_answer_is_the_one_worked_node_by_node(
    nodes: list[NodeCapacity], pods: list[QueuedPod]
) -> None:
    """`assess` asks each group of alike nodes, not each node: the answer is the plain
    one's (`capacity_reference`), with two resources, models, clusters and idle GPUs."""
    assert fleet(nodes, pods) == reference_assess(nodes, pods, now_ms=T0, idle_after_ms=MIN)
