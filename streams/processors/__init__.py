"""One partition's processors: node side, pod side, workloads, fleet; inputs to `Outputs`."""
