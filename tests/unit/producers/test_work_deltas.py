"""CounterDeltas: increases between scrapes through resets, restarts and missed scrapes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from producers.work.deltas import CounterDeltas, Increase


def test_the_first_scrape_of_a_pod_is_a_baseline() -> None:
    deltas = CounterDeltas()
    assert deltas.observe("p", {"steps": 1000.0}, 1.0e9) is None
    assert "p" in deltas
    assert deltas.observe("p", {"steps": 1150.0}, 1.0e9) == Increase({"steps": 150.0}, ())


def test_a_counter_below_its_previous_value_was_reset_and_counts_from_zero() -> None:
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 1000.0, "tokens": 50.0}, None)
    assert deltas.observe("p", {"steps": 30.0, "tokens": 80.0}, None) == Increase(
        {"steps": 30.0, "tokens": 30.0}, ("steps",)
    )
    assert deltas.observe("p", {"steps": 45.0, "tokens": 80.0}, None) == Increase(
        {"steps": 15.0, "tokens": 0.0}, ()
    )


def test_a_counter_going_backwards_without_a_restart_is_a_reset_too() -> None:
    # No process start, or the same one: Prometheus' increase() takes any drop as a reset.
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 500.0}, 7.0)
    assert deltas.observe("p", {"steps": 499.0}, 7.0) == Increase({"steps": 499.0}, ("steps",))


def test_a_new_process_start_time_counts_every_unit_from_zero() -> None:
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 100.0, "tokens": 10.0}, 1000.0)
    # The restarted process already did more than the old one had: still all new work.
    assert deltas.observe("p", {"steps": 120.0, "tokens": 3.0}, 1060.0) == Increase(
        {"steps": 120.0, "tokens": 3.0}, ("steps", "tokens")
    )
    assert deltas.observe("p", {"steps": 130.0, "tokens": 4.0}, 1060.0) == Increase(
        {"steps": 10.0, "tokens": 1.0}, ()
    )


def test_a_start_time_that_appears_or_disappears_is_no_restart() -> None:
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 100.0}, None)
    assert deltas.observe("p", {"steps": 110.0}, 50.0) == Increase({"steps": 10.0}, ())
    assert deltas.observe("p", {"steps": 120.0}, None) == Increase({"steps": 10.0}, ())
    # The last known start time is kept: a new one after a gap is a restart.
    assert deltas.observe("p", {"steps": 125.0}, 60.0) == Increase({"steps": 125.0}, ("steps",))


def test_a_pod_restarted_under_a_new_uid_is_a_new_pod() -> None:
    deltas = CounterDeltas()
    deltas.observe("old", {"steps": 100.0}, 1.0)
    deltas.forget("old")
    assert deltas.observe("new", {"steps": 5.0}, 2.0) is None  # a baseline, not 5 steps
    assert deltas.observe("new", {"steps": 9.0}, 2.0) == Increase({"steps": 4.0}, ())
    assert deltas.uids() == {"new"}
    assert deltas.observe("old", {"steps": 200.0}, 1.0) is None  # forgotten: a baseline again


def test_a_missed_scrape_keeps_the_baseline_so_the_next_covers_the_gap() -> None:
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 100.0}, 1.0)
    # Scrapes at 115 and 130 failed (not observed); the one at 145 sees all of it.
    assert deltas.observe("p", {"steps": 145.0}, 1.0) == Increase({"steps": 45.0}, ())


def test_a_unit_that_appears_counts_from_zero_and_a_missing_one_keeps_its_value() -> None:
    deltas = CounterDeltas()
    deltas.observe("p", {"steps": 10.0}, None)
    # requests' series appeared after the baseline (vLLM creates them at the first request)
    assert deltas.observe("p", {"steps": 12.0, "requests": 3.0}, None) == Increase(
        {"steps": 2.0, "requests": 3.0}, ()
    )
    assert deltas.observe("p", {"steps": 14.0}, None) == Increase({"steps": 2.0}, ())
    assert deltas.observe("p", {"steps": 15.0, "requests": 5.0}, None) == Increase(
        {"steps": 1.0, "requests": 2.0}, ()
    )


def test_pods_are_independent() -> None:
    deltas = CounterDeltas()
    deltas.observe("a", {"steps": 1.0}, None)
    deltas.observe("b", {"steps": 100.0}, None)
    assert deltas.observe("a", {"steps": 3.0}, None) == Increase({"steps": 2.0}, ())
    assert deltas.observe("b", {"steps": 150.0}, None) == Increase({"steps": 50.0}, ())
    assert len(deltas) == 2


# A counter's life: each step adds `done` units; a restart first sets it back to zero.
steps = st.lists(st.tuples(st.integers(0, 10**6), st.booleans()), min_size=1, max_size=60)


@given(st.integers(0, 10**6), steps)
def test_with_a_start_time_the_deltas_sum_to_the_true_increase(
    initial: int, life: list[tuple[int, bool]]
) -> None:
    deltas = CounterDeltas()
    value, start = float(initial), 1.0
    deltas.observe("p", {"u": value}, start)
    total, resets = 0.0, 0
    for done, restart in life:
        if restart:
            value, start = 0.0, start + 1
        value += done
        increase = deltas.observe("p", {"u": value}, start)
        assert increase is not None
        assert increase.units["u"] >= 0
        total += increase.units["u"]
        resets += increase.resets == ("u",)
    assert total == sum(done for done, _ in life)
    assert resets == sum(restart for _, restart in life)


@given(st.integers(1, 10**6), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**6),
       st.booleans()), min_size=1, max_size=60))  # fmt: skip
def test_without_a_start_time_every_drop_is_a_reset_and_the_sum_is_the_true_increase(
    initial: int, life: list[tuple[int, int, bool]]
) -> None:
    # A reset without a restart signal is seen when the counter is below its previous
    # value: after a reset it counts `after` (< previous), then the step's `done`.
    deltas = CounterDeltas()
    value = float(initial)
    deltas.observe("p", {"u": value}, None)
    total = true = 0.0
    for done, after, reset in life:
        previous = value
        if reset and previous > 0:
            value = float(after % int(previous))  # from zero, to below the old value
            true += value
            increase = deltas.observe("p", {"u": value}, None)
            assert increase == Increase({"u": value}, ("u",))
            total += increase.units["u"]
        value += done
        true += done
        increase = deltas.observe("p", {"u": value}, None)
        assert increase is not None
        assert increase.resets == ()
        total += increase.units["u"]
    assert total == true
