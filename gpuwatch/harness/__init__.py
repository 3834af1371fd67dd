"""The harness: what runs and measures the product without being part of it.

The cluster simulator (`simulate`: scenarios, simulated GPUs and nodes, a Kubernetes API
server for tests and the simulator), the local stack (`stack`: Kafka, Redis, Prometheus,
etcd and kube-apiserver as processes), the benchmarks (`bench`, with the Faust baseline
app `bench.floor_app`), example records of every contract (`examples`), and the wiring of
`gpuwatch simulate` and `gpuwatch demo` (`run`). No product module imports it: only the
CLI modules of the verbs `simulate`, `stack`, `bench` and `demo` do, inside their handlers
(the import contract "Product code does not import the harness", pyproject.toml).
"""
