"""The local stack: Kafka (KRaft), Redis and Prometheus as plain processes, no Docker."""

from gpuwatch.harness.stack.manager import down, status, up
from gpuwatch.harness.stack.service import ServiceStatus, StackError, format_table

__all__ = ["ServiceStatus", "StackError", "down", "format_table", "status", "up"]
