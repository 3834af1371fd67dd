"""The local stack: Kafka (KRaft), Redis and Prometheus as plain processes, no Docker."""
