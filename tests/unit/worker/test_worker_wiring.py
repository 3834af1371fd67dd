"""The worker's wiring without Kafka: broker credentials, names."""

from __future__ import annotations

from pydantic import SecretStr

from schemas.settings import KafkaSettings, Settings
from streams.faust.app import changelog_topic_names
from streams.faust.clients import aiokafka_options, credentials
from streams.faust.tick_timer import tick_topic_name


def test_plaintext_needs_no_credentials_and_sasl_passes_the_secret() -> None:
    assert credentials(KafkaSettings()) is None
    sasl = KafkaSettings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="gpuwatch",
        sasl_password=SecretStr("s3cret"),
    )
    found = credentials(sasl)
    assert (found.username, found.password, found.mechanism.value) == (
        "gpuwatch",
        "s3cret",
        "SCRAM-SHA-512",
    )
    assert found.ssl_context is not None  # SASL over TLS
    assert "ssl_context" in aiokafka_options(sasl)
    assert "ssl_cafile" not in aiokafka_options(sasl)


def test_internal_topics_carry_the_prefix_and_the_app_id() -> None:
    kafka = KafkaSettings(topic_prefix="replay-1.", app_id="gw-replay")
    settings = Settings(kafka=kafka)
    assert tick_topic_name(settings) == "replay-1.gw-replay.ticks"
    assert changelog_topic_names(settings) == (
        "replay-1.gw-replay.node-state.changelog",
        "replay-1.gw-replay.pod-state.changelog",
    )
