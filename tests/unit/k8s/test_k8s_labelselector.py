"""Label selectors as the API server applies them."""

from __future__ import annotations

import pytest

from gpuwatch.harness.simulate.kube.labelselector import parse_selector

LABELS = {"team": "vision", "tier": "batch", "gpu": ""}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        (None, True),
        ("", True),
        ("team=vision", True),
        ("team==vision", True),
        ("team=nlp", False),
        ("team!=nlp", True),
        ("owner!=x", True),  # a missing label is not equal to anything
        ("gpu", True),
        ("!gpu", False),
        ("!spot", True),
        ("gpu=", True),  # an empty value
        ("team in (vision, nlp)", True),
        ("team notin (vision,nlp)", False),
        ("spot notin (true)", True),
        ("team=vision,tier in (batch),!spot", True),
        ("team=vision, tier=serving", False),
    ],
)
def test_requirements_all_hold(selector: str | None, matches: bool) -> None:
    assert parse_selector(selector)(LABELS) is matches


@pytest.mark.parametrize("selector", ["team=vi sion", "in (a)", "team in a,b", "=x"])
def test_a_malformed_selector_is_an_error(selector: str) -> None:
    with pytest.raises(ValueError, match="unable to parse"):
        parse_selector(selector)
