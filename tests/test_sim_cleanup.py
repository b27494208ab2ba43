"""What ``gpunode sim down`` removes of nodes the fleet no longer records (gpunode_sim.fleet), on a fake cgroup tree."""

from __future__ import annotations

import json
from pathlib import Path

from gpunode_sim.fleet import FleetState, remove_unrecorded_cgroups, unrecorded_boots
from gpunode_sim.host.paths import SimPaths


def test_the_cgroups_of_a_node_whose_init_exited_before_it_was_recorded_are_removed(tmp_path: Path) -> None:
    """Before: an ``up`` that failed part-way left the kubelet cgroups of the nodes it never recorded (their init
    exited before sshd answered), and ``down`` only named them."""
    paths = SimPaths(tmp_path / "sim", tmp_path / "cache", 60)
    boots = {"node01": "0a1b2c3d-0000-4000-8000-000000000001", "node02": "9f8e7d6c-0000-4000-8000-000000000002"}
    for node, boot_id in boots.items():
        (paths.state / "nodes" / node).mkdir(parents=True)
        (paths.state / "nodes" / node / "boot.json").write_text(json.dumps({"boot_id": boot_id}))
    paths.fleet_file.write_text(json.dumps({"nodes": {"node02": {}}, "services": {}}))  # node02 still runs
    root = tmp_path / "cgroup"
    for controller in ("cpu", "memory", "pids"):
        for boot_id in boots.values():
            (root / controller / f"gpunode-{boot_id[:8]}" / "kubepods" / "besteffort").mkdir(parents=True)
    assert unrecorded_boots(paths, FleetState(paths)) == [boots["node01"]]
    said: list[str] = []
    remove_unrecorded_cgroups(paths, said.append, root)
    assert said == []
    assert sorted(p.relative_to(root).as_posix() for p in root.glob("*/gpunode-*")) == [
        f"{controller}/gpunode-9f8e7d6c" for controller in ("cpu", "memory", "pids")]  # the running node's stay
