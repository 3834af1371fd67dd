"""The pure core of the stream processors, grouped as the processors are: by the side it serves.

`node/`, `pod/`, `fleet/` and `workload/` hold the rules of one side each (what
`streams.processors.node`, `.pod`, `.fleet` and `.workloads` step); the modules at this
top level are what more than one side uses, directly or through another shared module:
time and delivery (`windows`, `ticks`, `alignment`, `progress`), the split of a GPU's
interval and its integrals (the node side computes them, the pod side carries them in
`pod.usage`), alert identity, and the checks of decoded input (`sanity`). A top-level
module imports no side; a side imports no other side but the node side, which builds the
fleet partition's inputs (`fleet.fleet_state`). The import contracts in pyproject.toml hold
this, and keep the core free of faust, Kafka and Redis clients, event loops and threads.
"""
