"""Producers: the node agent (NVML samples) and the Kubernetes watcher, publishing to Kafka."""
