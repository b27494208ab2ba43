"""Example production inventory: copy it, put your hosts in, keep the layout.

    pyinfra inventories/prod.py deploys/bootstrap.py
    gpunode verify inventories/prod.py --junit-xml verify.xml

Groups become data scopes: ``group_data/all.py`` applies to every host,
``group_data/<group>.py`` to that group's hosts, and per-host data goes in the
tuple next to the host name. Every key gpunode reads is listed, with its
default, in ``group_data/all.py``.
"""

# Hosts are reached as pyinfra reaches them, by deploy, verify and doctor alike: ssh_user, ssh_key, and
# ssh_config_file for a bastion (ProxyJump); _sudo for root, with _sudo_password if your sudoers ask for one.
# A100 nodes on containerd (the default runtime for Kubernetes).
a100_nodes = [
    ("gpu-a100-01.example.internal", {"ssh_user": "ubuntu", "_sudo": True}),
    ("gpu-a100-02.example.internal", {"ssh_user": "ubuntu", "_sudo": True}),
]

# HGX H100 nodes: NVSwitch, so the driver check also wants nvidia-fabricmanager at the driver's version.
h100_nodes = [
    ("gpu-h100-01.example.internal", {"ssh_user": "ubuntu", "_sudo": True, "gpu_required": True}),
]

# Legacy V100 nodes still running docker (cri-dockerd).
v100_nodes = [
    ("gpu-v100-01.example.internal", {"ssh_user": "ubuntu", "_sudo": True, "container_runtime": "docker"}),
]

gpu_nodes = a100_nodes + h100_nodes + v100_nodes
