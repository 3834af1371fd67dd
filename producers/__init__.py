"""Producers: the node agent and the Kubernetes watcher, publishing to Kafka; the simulator."""
