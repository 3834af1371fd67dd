"""Kubelet PodResources API client: which pod holds which GPU on this node."""
