"""pyinfra inventory of the running simulated fleet (written by ``gpunode sim up``).

    pyinfra inventories/sim.py exec -- nvidia-smi -L
    pyinfra inventories/sim.py deploys/bootstrap.py

The fleet's state folder is /var/lib/gpunode/sim unless GPUNODE_SIM_DIR says otherwise.
"""

import json
import os
import sys
from pathlib import Path

_inventory_file = Path(os.environ.get("GPUNODE_SIM_DIR", "/var/lib/gpunode/sim")) / "inventory.json"
if not _inventory_file.exists():
    sys.exit(f"inventories/sim.py: no simulated fleet is running ({_inventory_file} is missing); "
             "start one with 'gpunode sim up'")
_inventory = json.loads(_inventory_file.read_text())
_repo = _inventory["toolkit_repo"]


def _host(name: str) -> tuple[str, dict]:
    data = dict(_inventory["hosts"][name])
    data.update({
        "toolkit_repository_url": _repo["repository_url"],
        "toolkit_rpm_repository_url": _repo.get("rpm_repository_url",  # a fleet started before rpm nodes existed
                                                _repo["repository_url"].replace("/deb/$(ARCH)", "/rpm/$basearch")),
        "toolkit_key_url": _repo["key_url"],
        "toolkit_key_fingerprint": _repo["key_fingerprint"],
        "kubeconfig": _inventory["kubeconfig"],
        "kube_context": _inventory["kube_context"],
        **_inventory.get("plugin", {}),  # the plugin image in the fleet's registry, by digest, and its pull user
        # the node checker's image and how it reaches the API (GPUNODE_SIM_CHECKER=off: no node checker)
        **(_inventory.get("checker", {}) if os.environ.get("GPUNODE_SIM_CHECKER", "on") != "off" else {}),
    })
    return name, data


gpu_nodes = [_host(name) for name in _inventory["groups"]["gpu_nodes"]]
cpu_nodes = [_host(name) for name in _inventory["groups"]["cpu_nodes"]]
