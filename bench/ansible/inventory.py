"""Write an Ansible inventory of the running simulated fleet, with the values gpunode's deploy uses.

    .venv/bin/python bench/ansible/inventory.py [OUT]     # default: $GPUNODE_SIM_DIR/ansible-inventory.yml

Hosts, groups, SSH addresses and keys come from the fleet's inventory.json (what
inventories/sim.py reads); the toolkit's repository, key and fingerprint from the
fleet's local repository; versions and paths from gpunode's settings defaults.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from gpunode.settings import KEYRING_PATH, LIST_PATH, TOOLKIT_PACKAGES, NodeSettings


def inventory(fleet: dict) -> dict:
    defaults = NodeSettings()
    repo = fleet["toolkit_repo"]
    shared = {
        "ansible_user": fleet["hosts"][next(iter(fleet["hosts"]))]["ssh_user"], "ansible_become": True,
        "driver_min_version": defaults.driver_min_version, "toolkit_version": defaults.toolkit_version,
        "toolkit_packages": list(TOOLKIT_PACKAGES), "keyring_path": KEYRING_PATH, "list_path": LIST_PATH,
        "toolkit_repository_url": repo["repository_url"], "toolkit_key_url": repo["key_url"],
        "toolkit_key_fingerprint": repo["key_fingerprint"],
    }
    groups: dict = {}
    for group, names in fleet["groups"].items():
        hosts = {}
        for name in names:
            host = fleet["hosts"][name]
            hosts[name] = {
                # the fleet's ssh_config: its user, key, known hosts and the ProxyJump through the bastion
                "ansible_ssh_private_key_file": host["ssh_key"],
                "ansible_ssh_common_args": f"-F {host['ssh_config_file']}",
                "container_runtime": host.get("container_runtime", "none"),
                "gpu_expected": bool(host.get("gpu_expected")),
            }
        groups[group] = {"hosts": hosts}
    return {"all": {"vars": shared, "children": groups}}


def main() -> None:
    state = Path(os.environ.get("GPUNODE_SIM_DIR", "/var/lib/gpunode/sim"))
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else state / "ansible-inventory.yml"
    fleet = json.loads((state / "inventory.json").read_text())
    out.write_text(json.dumps(inventory(fleet), indent=1))  # JSON is YAML: Ansible reads it as such
    print(out)


if __name__ == "__main__":
    main()
