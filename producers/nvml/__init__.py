"""The GPU reader: NVML through nvidia-ml-py (`pynvml`), behind Protocols a fake can fill."""
