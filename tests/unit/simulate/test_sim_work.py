"""Units of work in the simulation: counters served over HTTP at event time, scraped by the
node agents within their ticks, onto the samples and `work.units`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gpuwatch.harness.simulate.work import WorkCounters, metric_of, work_annotations
from producers.work.targets import parse_target


def counted(text: bytes) -> dict[str, float]:
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_counters_run_from_the_container_start_and_restart_from_zero() -> None:
    now = [100.0]
    counters = WorkCounters(lambda: now[0])
    counters.start("u1", {"steps": 10.0, "tokens": 2.0}, 40.0)
    text = counters.exposition("u1")
    assert text is not None
    values = counted(text)
    assert values["train_steps_total"] == 600.0
    assert values["vllm:generation_tokens_total"] == 120.0
    assert values["process_start_time_seconds"] == 40.0
    counters.stop("u1", 70.0)  # crashed: the values stay
    now[0] = 200.0
    assert counted(counters.exposition("u1") or b"")["train_steps_total"] == 300.0
    counters.start("u1", {"steps": 10.0}, 190.0)  # restarted
    assert counted(counters.exposition("u1") or b"")["train_steps_total"] == 100.0
    counters.remove("u1")
    assert counters.exposition("u1") is None


def test_the_annotations_are_read_as_the_agent_reads_a_pods() -> None:
    notes = work_annotations({"tokens": 1500.0, "steps": 10.0}, 8000, "u1")
    assert (
        notes["gpuwatch.io/work"] == "steps=train_steps_total,tokens=vllm:generation_tokens_total"
    )
    target = parse_target("ml", "p", "u1", "a-0", notes, "127.0.0.1")
    assert target is not None
    assert target.url == "http://127.0.0.1:8000/pods/u1/metrics"
    assert dict(target.units) == {"steps": metric_of("steps"), "tokens": metric_of("tokens")}
    assert work_annotations({}, 8000, "u1") == {}
