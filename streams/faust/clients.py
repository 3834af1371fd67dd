"""The aiokafka clients and Faust broker credentials, from the Kafka settings.

Faust and aiokafka take a TLS context rather than a CA file and a client certificate:
both get the one `KafkaSettings.ssl_context()` makes.
"""

from __future__ import annotations

from typing import Any

import faust
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from schemas.settings import KafkaSettings

__all__ = [
    "TopicPartition",
    "aiokafka_consumer",
    "aiokafka_options",
    "aiokafka_producer",
    "credentials",
]


def credentials(kafka: KafkaSettings) -> Any:
    """Faust broker credentials from the Kafka settings; None for PLAINTEXT."""
    context = kafka.ssl_context()
    if kafka.security_protocol.startswith("SASL"):
        password = kafka.sasl_password
        return faust.SASLCredentials(
            username=kafka.sasl_username,
            password=None if password is None else password.get_secret_value(),
            mechanism=kafka.sasl_mechanism or "PLAIN",
            ssl_context=context,
        )
    if context is not None:
        return faust.SSLCredentials(context)
    return None


def aiokafka_options(kafka: KafkaSettings) -> dict[str, Any]:
    """Connection options in aiokafka's names (it takes an SSL context, not the files)."""
    options = kafka.client_options()
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        options.pop(name, None)
    context = kafka.ssl_context()
    if context is not None:
        options["ssl_context"] = context
    return options


def aiokafka_producer(kafka: KafkaSettings, **overrides: Any) -> Any:
    """An aiokafka producer of the settings' cluster (not started)."""
    return AIOKafkaProducer(**aiokafka_options(kafka), **overrides)


def aiokafka_consumer(kafka: KafkaSettings, *topics: str, **overrides: Any) -> Any:
    """An aiokafka consumer of the settings' cluster, subscribed to `topics` (not started)."""
    return AIOKafkaConsumer(*topics, **aiokafka_options(kafka), **overrides)
