"""gpunode: from a bare NVIDIA GPU machine to a Kubernetes node whose pods get working GPUs."""

__version__ = "0.1.0"
