"""`gpuwatch replay`: what happened to a pod, GPU or node, from the topics; `--rerun`."""
