"""The wiring of the harness's long-running verbs: `gpuwatch simulate` and `gpuwatch demo`."""
