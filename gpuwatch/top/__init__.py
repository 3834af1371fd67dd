"""`gpuwatch top`: the live terminal view of pods, GPUs, alerts and capacity, from Redis."""
