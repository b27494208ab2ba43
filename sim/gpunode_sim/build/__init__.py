"""Real components built once per machine from Go modules: Kubernetes, the kubelet, NVIDIA's tools."""
