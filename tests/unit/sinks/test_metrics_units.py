"""`gpuwatch_pod_cost_per_unit_usd{unit}`: the cost of a unit of work in a pod's latest window."""

from __future__ import annotations

from support.metric_records import T0, S, attribution, lifecycle, series, value, worker

POD = {"namespace": "ml", "pod": "train-0", "team": "vision", "node": "n1"}
NAME = "gpuwatch_pod_cost_per_unit_usd"


def test_each_unit_of_the_latest_window_is_a_series() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle("u1", to="running", ts=T0))
    metrics.observe_attribution(
        attribution(
            "u1",
            T0,
            cost_usd=0.0666,
            work_units={"steps": 600.0, "samples": 19_200.0},
            cost_per_unit={"steps": 0.000111, "samples": 0.0000034},
        )
    )
    assert value(metrics, NAME, **POD, unit="steps") == 0.000111
    assert value(metrics, NAME, **POD, unit="samples") == 0.0000034
    # The next window did no samples: that unit has no cost of its own now.
    metrics.observe_attribution(
        attribution(
            "u1",
            T0 + 60 * S,
            work_units={"steps": 500.0, "samples": 0.0},
            cost_per_unit={"steps": 0.000132, "samples": None},
        )
    )
    assert value(metrics, NAME, **POD, unit="steps") == 0.000132
    assert value(metrics, NAME, **POD, unit="samples") is None
    # A window read again out of order does not bring the older figure back.
    metrics.observe_attribution(
        attribution("u1", T0, work_units={"steps": 600.0}, cost_per_unit={"steps": 0.000111})
    )
    assert value(metrics, NAME, **POD, unit="steps") == 0.000132


def test_a_pod_without_units_has_no_series() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle("u2", to="running", ts=T0))
    metrics.observe_attribution(attribution("u2", T0, work_units={}, cost_per_unit={}))
    assert series(metrics, NAME) == []


def test_the_newest_revision_of_the_latest_window_gives_the_cost_per_unit() -> None:
    metrics = worker()
    metrics.observe_lifecycle(lifecycle("u1", to="running", ts=T0))
    metrics.observe_attribution(attribution("u1", T0, cost_per_unit={"steps": 0.000111}))
    revised = {"steps": 0.000100}  # late steps came for the window: each cost less
    metrics.observe_attribution(attribution("u1", T0, cost_per_unit=revised, revision=1))
    assert value(metrics, NAME, **POD, unit="steps") == 0.0001
    metrics.observe_attribution(attribution("u1", T0, cost_per_unit={"steps": 0.000111}))
    assert value(metrics, NAME, **POD, unit="steps") == 0.0001
