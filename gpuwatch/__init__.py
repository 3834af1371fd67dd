"""gpuwatch wiring: the command line, the settings loader, the local stack and topic admin."""

__version__ = "0.1.0"
