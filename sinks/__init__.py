"""Sinks: derived records written to Redis (live state) and Prometheus (metrics)."""
