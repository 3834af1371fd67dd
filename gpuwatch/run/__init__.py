"""The wiring of the long-running verbs: node agent, watcher, worker, sinks."""
