"""The Prometheus metrics: their records, collector and exposition, and `sink metrics`' feed."""
