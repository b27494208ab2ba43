"""What runs inside a node: its init, the docker nodes' kubelet agent, the device-manager stand-in, systemctl,
workloads."""
