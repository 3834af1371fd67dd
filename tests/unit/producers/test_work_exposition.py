"""read_counters: the units' counters in a pod's exposition, and hostile text refused."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from producers.work.exposition import (
    MAX_LINE_CHARS,
    BadExposition,
    Counters,
    read_counters,
)

# What vLLM 0.x serves (prometheus_client, one series per model), cut down.
VLLM = b"""\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama-3-8b"} 12345.0
vllm:generation_tokens_total{engine="0",model_name="llama-3-70b"} 655.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama-3-8b"} 40.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama-3-8b"} 2.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-3-8b"} 3.0
# HELP vllm:e2e_request_latency_seconds Histogram of end to end request latency.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0",model_name="llama-3-8b"} 30.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="llama-3-8b"} 42.0
vllm:e2e_request_latency_seconds_count{model_name="llama-3-8b"} 42.0
vllm:e2e_request_latency_seconds_sum{model_name="llama-3-8b"} 61.5
# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.76441232e+09
"""

UNITS = {
    "tokens": "vllm:generation_tokens_total",
    "requests": "vllm:request_success_total",
    "latency_count": "vllm:e2e_request_latency_seconds_count",
}


def test_vllm_counters_are_summed_over_their_labels() -> None:
    read = read_counters(VLLM, UNITS, max_series=100)
    assert read == Counters(
        values={"tokens": 13000.0, "requests": 42.0, "latency_count": 42.0},
        missing=frozenset(),
        process_start=1764412320.0,
    )


@pytest.mark.parametrize("metric", ["vllm:generation_tokens_total", "vllm:generation_tokens"])
def test_a_counter_matches_with_or_without_total(metric: str) -> None:
    assert read_counters(VLLM, {"t": metric}, 100).values == {"t": 13000.0}


@pytest.mark.parametrize(
    "text",
    [
        b"# TYPE steps counter\nsteps 7\n",  # the parser calls its sample steps_total
        b"# TYPE steps_total counter\nsteps_total 7\n",
        b"steps_total 7\n",  # untyped
        b"steps 7\n",
        b"# TYPE steps counter\nsteps_total 7\n# EOF\n",  # OpenMetrics, served anyway
    ],
)
@pytest.mark.parametrize("metric", ["steps", "steps_total"])
def test_total_on_either_side_is_the_same_counter(text: bytes, metric: str) -> None:
    assert read_counters(text, {"steps": metric}, 10).values == {"steps": 7.0}


def test_a_metric_the_pod_does_not_expose_is_missing() -> None:
    read = read_counters(VLLM, {"tokens": "vllm:generation_tokens", "steps": "steps"}, 100)
    assert read.values == {"tokens": 13000.0}
    assert read.missing == {"steps"}


def test_two_units_may_name_one_metric_and_a_gauge_is_not_a_start_time() -> None:
    text = b'a_total 3\nprocess_start_time_seconds{worker="1"} 5\n'
    read = read_counters(text, {"x": "a", "y": "a_total"}, 10)
    assert read.values == {"x": 3.0, "y": 3.0}
    assert read.process_start == 5.0  # only a labelled one: taken
    assert read_counters(b"a 1\n", {"x": "a"}, 10).process_start is None


def test_the_unlabelled_process_start_wins_and_an_infinite_one_is_none() -> None:
    text = b'process_start_time_seconds{w="1"} 5\nprocess_start_time_seconds 9\n'
    assert read_counters(text, {}, 10).process_start == 9.0
    assert read_counters(b"process_start_time_seconds +Inf\n", {}, 10).process_start is None


def test_prometheus_client_exposition_round_trips() -> None:
    registry = CollectorRegistry()
    steps = Counter("train_steps", "Steps", registry=registry)
    tokens = Counter("tokens", "Tokens", ["model"], registry=registry)
    Gauge("loss", "Loss", registry=registry).set(math.nan)  # NaN gauges are not ours
    steps.inc(12)
    tokens.labels("a").inc(5)
    tokens.labels("b").inc(2.5)
    read = read_counters(
        generate_latest(registry), {"steps": "train_steps_total", "tokens": "tokens"}, 100
    )
    assert read.values == {"steps": 12.0, "tokens": 7.5}


def test_more_samples_than_max_series_is_refused_before_parsing() -> None:
    text = b"# HELP x y\n" + b"".join(b'x{i="%d"} 1\n' % i for i in range(101))
    assert read_counters(text, {"x": "x"}, 101).values == {"x": 101.0}
    with pytest.raises(BadExposition) as bad:
        read_counters(text, {"x": "x"}, 100)
    assert bad.value.reason == "too_many_series"


def test_a_huge_line_is_refused() -> None:
    text = b'x{a="' + b"v" * MAX_LINE_CHARS + b'"} 1\n'
    with pytest.raises(BadExposition) as bad:
        read_counters(text, {"x": "x"}, 10)
    assert bad.value.reason == "line_too_long"
    assert "line 1" in str(bad.value)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (b"\xff\xfe\x00\x01binary\x80", "not_utf8"),
        (bytes(range(256)) * 4, "not_utf8"),
        (b'x{a="1" 5\n', "unparsable"),
        (b"x 1 2 3 four\n", "unparsable"),
        (b"x{a=b} 1\n", "unparsable"),
        (b"# TYPE\n", "unparsable"),
        (b"x\x00 1\n", "unparsable"),
        (b"steps NaN\n", "bad_value"),
        (b"steps +Inf\n", "bad_value"),
        (b"steps -Inf\n", "bad_value"),
        (b"steps -1\n", "bad_value"),
        (b"steps " + b"9" * 400 + b"\n", "bad_value"),
        (b'steps{a="1"} 1e308\nsteps{a="2"} 1e308\n', "bad_value"),
    ],
)
def test_text_that_cannot_be_read_is_a_bad_exposition(text: bytes, reason: str) -> None:
    with pytest.raises(BadExposition) as bad:
        read_counters(text, {"steps": "steps"}, 100)
    assert bad.value.reason == reason


def test_a_nan_in_a_metric_that_is_not_a_unit_is_fine() -> None:
    text = b"other NaN\nsteps 3\n"
    assert read_counters(text, {"steps": "steps"}, 10).values == {"steps": 3.0}


def test_an_empty_exposition_has_every_unit_missing() -> None:
    assert read_counters(b"", {"a": "x", "b": "y"}, 1) == Counters({}, frozenset("ab"), None)


lines = st.one_of(
    st.text(max_size=80),
    st.sampled_from(
        ["# TYPE steps counter", "# HELP steps x", "steps 1", 'steps{a="\\"} 2', "steps NaN",
         "steps_total{a=\"b\",} 3", "{__name__=\"steps\"} 4", "# TYPE steps", "steps 1 2 3"]
    ),
)  # fmt: skip


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.binary(max_size=300), st.lists(lines, max_size=12).map(
    lambda ls: "\n".join(ls).encode())))  # fmt: skip
def test_any_text_reads_or_is_a_bad_exposition(text: bytes) -> None:
    try:
        read = read_counters(text, {"steps": "steps", "other": "x:y"}, 8)
    except BadExposition as exc:
        assert exc.reason  # noqa: PT017 - the reason is what the metric counts
        return
    assert set(read.values) | read.missing == {"steps", "other"}
    assert all(math.isfinite(v) and v >= 0 for v in read.values.values())
