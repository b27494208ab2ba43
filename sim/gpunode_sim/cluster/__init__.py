"""The fleet's control plane: the real Kubernetes binaries, their PKI, the API server's egress to the kubelets."""
