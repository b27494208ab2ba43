"""gpunode's Kubernetes device plugin for NVIDIA GPUs.

A skeleton for now: the package installs on its own (no pyinfra, no paramiko)
and its entry point runs; the kubelet API, NVML discovery and health come with
the device-plugin issue.
"""

__version__ = "0.1.0"
