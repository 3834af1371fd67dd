"""The scenario format: shipped files load, defaults apply, every error names its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatch.harness.simulate.scenario import (
    SCENARIOS_DIR,
    ScenarioError,
    load_scenario,
    node_names,
    parse_scenario,
    scenario_names,
    with_overrides,
)

MINIMAL = """\
name: tiny
nodes:
  - pool: gpu
"""

BASE = """\
name: t
nodes:
  - pool: a
    count: 2
    gpus_per_node: 4
  - pool: mig
    sharing: mig
    mig_profiles: [3g.40gb, 2g.20gb, 1g.10gb]
  - pool: ts
    model: l40s
    sharing: time-slicing
    replicas: 4
workloads:
  - name: w
    kind: training
"""


def scenario_with(extra: str) -> str:
    """BASE with `extra` appended (the workload's fields, indented, or top-level keys)."""
    return BASE + extra


def test_the_shipped_scenarios_load_by_name_and_by_path() -> None:
    assert scenario_names() == ["dra", "fleet", "incident", "small"]
    for name in scenario_names():
        by_name = load_scenario(name)
        assert by_name.name == name
        assert load_scenario(SCENARIOS_DIR / f"{name}.yaml") == by_name
        assert load_scenario(str(SCENARIOS_DIR / f"{name}.yaml")) == by_name


def test_fleet_has_forty_nodes_and_320_gpus() -> None:
    fleet = load_scenario("fleet")

    assert sum(pool.count for pool in fleet.nodes) == 40
    assert sum(pool.count * pool.gpus_per_node for pool in fleet.nodes) == 320


def test_a_minimal_scenario_gets_the_defaults() -> None:
    scenario = parse_scenario(MINIMAL)

    (pool,) = scenario.nodes
    assert (pool.count, pool.model, pool.gpus_per_node, pool.sharing) == (1, "h100", 8, "exclusive")
    assert (scenario.seed, scenario.scheduler, scenario.finished_ttl_s) == (0, "spread", None)
    assert scenario.workloads == ()
    assert scenario.faults == ()
    assert node_names(pool) == ["gpu-0"]


def test_spans_are_numbers_or_pairs() -> None:
    scenario = parse_scenario(scenario_with("    start_s: -60\n    duration_s: [60, 120]\n"))

    workload = scenario.workloads[0]
    assert workload.start_s == -60.0
    assert workload.duration_s == (60.0, 120.0)
    assert workload.mem_fraction == (0.3, 0.85)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: x\n", "Object missing required field `nodes`"),
        ("- a\n- b\n", "a scenario is a mapping"),
        ("name: [unclosed\n", "not valid YAML"),
        (MINIMAL + "colour: red\n", "unknown field `colour`"),
        ("name: x\nnodes:\n  - pool: a\n    count: two\n", "`$.nodes[0].count`"),
        ("name: x\nnodes:\n  - pool: a\n    count: -1\n", "`$.nodes[0].count`"),
        ("name: x\nnodes:\n  - pool: A_B\n", "`$.nodes[0].pool`"),
        ("name: x\nnodes: []\n", "`$.nodes`"),
        ("name: x\nnodes:\n  - pool: a\n    model: a100\n", "$.nodes[0].model: unknown GPU model"),
        ("name: x\nnodes:\n  - pool: a\n    sharing: mps\n", "`$.nodes[0].sharing`"),
        (
            "name: x\nnodes:\n  - pool: a\n    sharing: time-slicing\n",
            "$.nodes[0].replicas: time-slicing needs replicas",
        ),
        ("name: x\nnodes:\n  - pool: a\n    replicas: 4\n", "$.nodes[0].replicas: only for"),
        (
            "name: x\nnodes:\n  - pool: a\n    sharing: mig\n",
            "$.nodes[0].mig_profiles: sharing mig needs",
        ),
        (
            "name: x\nnodes:\n  - pool: a\n    sharing: mig\n    mig_profiles: [1g.10gb, big]\n",
            "$.nodes[0].mig_profiles[1]: 'big' is not a MIG profile",
        ),
        (
            "name: x\nnodes:\n  - pool: a\n    sharing: mig\n"
            "    mig_profiles: [4g.40gb, 4g.40gb]\n",
            "$.nodes[0].mig_profiles: 8 compute slices",
        ),
        (
            "name: x\nnodes:\n  - pool: a\n    model: l40s\n    sharing: mig\n"
            "    mig_profiles: [1g.10gb]\n",
            "$.nodes[0].sharing: l40s has no MIG",
        ),
        (
            "name: x\nnodes:\n  - pool: a\n    mig_profiles: [1g.10gb]\n",
            "$.nodes[0].mig_profiles: only for sharing: mig",
        ),
        ("name: x\nnodes:\n  - pool: a\n  - pool: a\n", "$.nodes[1].pool: 'a' is named twice"),
        (
            "name: x\nnodes:\n  - {pool: a}\nworkloads:\n  - {name: w, kind: training, queue: q}\n",
            "$.workloads[0].queue: no queue 'q' in queues (queues: none)",
        ),
        (
            "name: x\nnodes:\n  - {pool: a}\nqueues:\n  - {name: q, gpus: 4}\nworkloads:\n"
            "  - {name: w, kind: inference, queue: q, recreate_after_s: 5}\n",
            "$.workloads[0].queue: Kueue queues jobs here: give owner: job; "
            "$.workloads[0].recreate_after_s: a queued job's pods are not recreated",
        ),
        (
            "name: x\nnodes:\n  - {pool: d, dra: true, sharing: time-slicing, replicas: 2}\n",
            "$.nodes[0].dra: a DRA pool shares GPUs through shared claims, not replicas",
        ),
        (
            "name: x\nnodes:\n  - {pool: d, dra: true}\nworkloads:\n"
            "  - {name: w, kind: training, pool: d}\n",
            "$.workloads[0].claim: pool d hands out GPUs through claims only",
        ),
        (
            "name: x\nnodes:\n  - {pool: d, dra: true}\nworkloads:\n"
            "  - {name: w, kind: training, claim: shared, gpus: 0}\n",
            "$.workloads[0].gpus: a claim needs gpus of 1 or more",
        ),
    ],
)
def test_each_error_names_the_field(text: str, expected: str) -> None:
    with pytest.raises(ScenarioError, match=r"^where\.yaml: ") as caught:
        parse_scenario(text, "where.yaml")

    assert expected in str(caught.value)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("    kind: sleeping\n", "`$.workloads[0].kind`"),
        ("    gpus: -1\n", "`$.workloads[0].gpus`"),
        ("    pool: nowhere\n", "$.workloads[0].pool: no node pool 'nowhere'"),
        ("    pods: 2\n    pods_per_node: 1\n", "$.workloads[0]: give pods or pods_per_node"),
        ("    mig_profile: 7g.80gb\n", "$.workloads[0].mig_profile: no pool offers 7g.80gb"),
        (
            "    mig_profile: 1g.10gb\n    pool: a\n",
            "$.workloads[0].mig_profile: no pool a offers 1g.10gb",
        ),
        ("    mig_profile: 1g.10gb\n    gpus: 0\n", "$.workloads[0].gpus: a mig_profile needs"),
        ("    claim: per-pod\n", "$.workloads[0].claim: no DRA pool (dra: true) for the claim"),
        ("    claim: single\n", "`$.workloads[0].claim`"),
        ("    duration_s: [120, 60]\n", "$.workloads[0].duration_s: [low, high] with low <= high"),
        ("    mem_fraction: 1.5\n", "$.workloads[0].mem_fraction: must be within 0 and 1"),
        ("    peak_util_pct: [50, 150]\n", "$.workloads[0].peak_util_pct: must be within"),
        ("    start_s: .nan\n", "$.workloads[0].start_s: must be a finite number"),
        ("    start_s: [1, 2, 3]\n", "`$.workloads[0].start_s`"),
        ("    nickname: x\n", "unknown field `nickname` - at `$.workloads[0]`"),
        (
            "  - name: w\n    kind: idle\n",
            "$.workloads[1].name: 'w' is named twice",
        ),
        (
            "  - name: loop\n    kind: crashloop\n    duration_s: 60\n",
            "$.workloads[1].duration_s: a crashloop workload never ends",
        ),
        (
            "  - name: leak\n    kind: idle\n    gpus: 0\n    unallocated_gpus: 1\n"
            "    recreate_after_s: 10\n",
            "$.workloads[1].recreate_after_s: a leaking pod",
        ),
        (
            "faults:\n  - kind: agent-down\n    node: a-9\n    at_s: 10\n",
            "$.faults[0].node: no node 'a-9'",
        ),
        (
            "faults:\n  - kind: xid\n    node: a-1\n    at_s: 10\n    gpu: 4\n",
            "$.faults[0].gpu: a-1 has GPUs 0 to 3",
        ),
        ("faults:\n  - kind: meteor\n    node: a-1\n    at_s: 10\n", "`$.faults[0].kind`"),
        (
            "faults:\n  - {kind: throttle, node: a-1, at_s: 10, reason: gpu_idle}\n",
            "$.faults[0].reason: unknown throttle reason 'gpu_idle' (known: sw_power_cap, "
            "hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown, sw_thermal_slowdown, "
            "sync_boost)",
        ),
        (
            "faults:\n  - {kind: throttle, node: ts-0, at_s: 10, gpu: 8}\n",
            "$.faults[0].gpu: ts-0 has GPUs 0 to 7",
        ),
        ("faults:\n  - {kind: ecc, node: a-0, at_s: 1, gpu: 9}\n", "$.faults[0].gpu: a-0 has"),
        (
            "faults:\n  - {kind: remap-failure, node: a-0, at_s: 1, gpu: 4}\n",
            "$.faults[0].gpu: a-0 has GPUs 0 to 3",
        ),
        (
            "faults:\n  - {kind: remap-failure, node: mig-0, at_s: 1}\n",
            "$.faults[0].kind: a GPU in MIG mode reports no remapped rows",
        ),
        (
            "faults:\n  - {kind: ecc, node: a-0, at_s: 1, duration_s: 60}\n",
            "$.faults[0].duration_s: ecc lasts until the GPU is replaced or reset",
        ),
        (
            "faults:\n  - {kind: xid, node: a-0, at_s: 1, code: 31, duration_s: 60}\n",
            "$.faults[0].duration_s: only Xid 79 has one",
        ),
        (
            "faults:\n  - {kind: throttle, node: a-0, at_s: 1, duration_s: 0}\n",
            "`$.faults[0].duration_s`",
        ),
    ],
)
def test_each_workload_and_fault_error_names_the_field(extra: str, expected: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(scenario_with(extra), "s.yaml")

    assert expected in str(caught.value)


def test_several_problems_are_reported_together() -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(scenario_with("    pool: nowhere\n    mem_fraction: 2\n"))

    message = str(caught.value)
    assert "$.workloads[0].pool" in message
    assert "$.workloads[0].mem_fraction" in message


def test_an_unknown_name_lists_the_shipped_scenarios() -> None:
    with pytest.raises(
        ScenarioError, match=r"no scenario named 'huge' \(shipped: dra, fleet, incident"
    ):
        load_scenario("huge")


def test_an_unreadable_path_says_so(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")


def test_overrides_set_every_pool_and_are_checked() -> None:
    scenario = parse_scenario(BASE)

    bigger = with_overrides(scenario, nodes=5, gpus_per_node=2, seed=99)

    assert [pool.count for pool in bigger.nodes] == [5, 5, 5]
    assert [pool.gpus_per_node for pool in bigger.nodes] == [2, 2, 2]
    assert bigger.seed == 99
    assert bigger.workloads == scenario.workloads
    with pytest.raises(ScenarioError, match="--nodes must be 1 or more"):
        with_overrides(scenario, nodes=0)
    with pytest.raises(ScenarioError, match="--gpus-per-node must be 1 to 16"):
        with_overrides(scenario, gpus_per_node=17)


def test_an_override_that_removes_a_faulted_node_is_refused() -> None:
    scenario = parse_scenario(
        scenario_with("faults:\n  - kind: agent-down\n    node: a-1\n    at_s: 10\n")
    )

    with pytest.raises(ScenarioError, match=r"\$\.faults\[0\]\.node: no node 'a-1'"):
        with_overrides(scenario, nodes=1)
