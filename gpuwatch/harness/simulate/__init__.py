"""`gpuwatch simulate`: a synthetic Kubernetes GPU cluster from a scenario, driving the real
node agents and the real Kubernetes watcher (scenario -> cluster core -> API server and
simulated GPUs -> producers -> Kafka)."""
