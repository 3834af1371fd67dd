"""The simulator's Kubernetes API: an in-process API server, and the writer of a real one."""
