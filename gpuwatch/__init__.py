"""The `gpuwatch` command and its wiring: CLI, settings, Kafka admin, processes, stack, tools."""

__version__ = "0.1.0"
