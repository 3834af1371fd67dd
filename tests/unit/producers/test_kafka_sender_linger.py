"""How long the node agent's Kafka client lingers, by sampling interval."""

from __future__ import annotations

from producers.base.kafka import FAST_LINGER_MS, LINGER_MS, KafkaSender, linger_ms
from schemas.settings import KafkaSettings


def test_sub_second_sampling_lingers_for_several_samples_and_1_hz_does_not() -> None:
    assert linger_ms(0.1) == FAST_LINGER_MS == 250
    assert linger_ms(0.49) == FAST_LINGER_MS
    assert linger_ms(0.5) == LINGER_MS == 20
    assert linger_ms(1.0) == LINGER_MS
    assert linger_ms(30.0) == LINGER_MS


def test_the_sender_takes_the_linger_it_is_given() -> None:
    sender = KafkaSender(KafkaSettings(), "t.nvml.samples", "c", linger_ms=linger_ms(0.1))
    assert sender._config["linger_ms"] == 250  # the client is built from this on first use
    assert KafkaSender(KafkaSettings(), "t", "c")._config["linger_ms"] == LINGER_MS
