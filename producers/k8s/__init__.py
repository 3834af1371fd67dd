"""The Kubernetes watcher: list+watch of Pods, Nodes and Kueue Workloads into `k8s.*` topics.

Pure core: `objects` (typed API JSON), `selection` (GPU pods and nodes, effective GPU
request), `owners` (ReplicaSet -> Deployment, Job -> CronJob), `normalise` (objects to
values), `resync` (what to publish after an event or a relist). Effects: `watching`
(the list+watch loop), `watcher` (all watches of the settings), `client` (the
`kubernetes` client, the only importer of it), `metrics`. The in-process API server that
speaks list/watch, for tests and the cluster simulator, is `gpuwatch.harness.simulate.kube`.
"""
