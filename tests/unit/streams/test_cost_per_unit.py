"""Cost per unit of work, worked out by hand, through the worker's stream logic.

On one node sampled every second, with the properties' 10 s windows, at $4.00 per
H100-hour (the built-in price):
- a training pod reporting 10 steps a second, its counter scraped every 5 s from its
  start: a window it runs whole holds 2 scrapes, 100 steps, and costs 4/360 USD, so a
  step costs 4/36,000 USD = 0.000111111 USD;
- a serving pod reporting 1,500 tokens a second: 15,000 tokens a window, a token costing
  4/5,400,000 USD, a thousand tokens 0.000740741 USD.
In every order of arrival and after a restart the records say the same.
"""

from __future__ import annotations

import pytest
from histories import History, NodePlan, PodPlan, pod_uid
from test_backlog_properties import T0, WINDOWS, differences, run

S = 1000
MINUTE = 60 * S
WINDOW = WINDOWS.window_s * S  # 10 s
TRAIN, SERVE = pod_uid(3, 0), pod_uid(3, 1)


def history() -> History:
    node = NodePlan("gwunit-n0", gpus=2, interval_ms=S)
    pods = (
        PodPlan(TRAIN, node.name, 0, 0, 0, 5 * MINUTE, steps_per_s=10.0),
        PodPlan(SERVE, node.name, 1, 0, 0, 5 * MINUTE, steps_per_s=1500.0, unit="tokens"),
    )
    return History(T0, 6 * MINUTE, (node,), pods)


def _windows(uid: str) -> list[dict[str, object]]:
    records = run(history(), "live", 2).records()["attribution"]
    return sorted((r for r in records if r["uid"] == uid), key=lambda r: r["window_start"])


def test_a_training_step_costs_four_dollars_an_hour_over_36000_steps() -> None:
    windows = _windows(TRAIN)
    assert [w["window_start"] for w in windows] == [T0 + i * WINDOW for i in range(30)]
    # The first window holds the scrape at 5 s only: the one at 0 s is the baseline.
    assert windows[0]["work_units"] == {"steps": 50.0}
    for w in windows[1:]:
        assert w["work_units"] == {"steps": 100.0}
        assert w["cost_usd"] == pytest.approx(4.0 / 360, abs=1e-12)
        assert abs(w["cost_per_unit"]["steps"] - 4.0 / 36_000) < 1e-9  # type: ignore[index]
    first = windows[0]["cost_per_unit"]["steps"]  # type: ignore[index]
    assert abs(first - (4.0 / 360) / 50) < 1e-9


def test_a_thousand_tokens_cost_four_dollars_over_5400_thousand() -> None:
    for w in _windows(SERVE)[1:]:
        assert w["work_units"] == {"tokens": 15_000.0}
        per_thousand = 1000 * w["cost_per_unit"]["tokens"]  # type: ignore[index]
        assert abs(per_thousand - 4.0 / 5_400) < 1e-9
        assert round(per_thousand, 9) == 0.000740741


def test_a_pod_without_units_has_neither_field() -> None:
    node = NodePlan("gwunit-n1", gpus=1, interval_ms=S)
    plain = History(T0, 3 * MINUTE, (node,), (PodPlan(TRAIN, node.name, 0, 0, 0, 2 * MINUTE),))
    records = run(plain, "live", 1).records()["attribution"]
    assert records
    assert not [r for r in records if "work_units" in r or "cost_per_unit" in r]


@pytest.mark.parametrize("partitions", [1, 3])
def test_every_order_gives_the_same_units(partitions: int) -> None:
    assert differences(history(), partitions) == []
