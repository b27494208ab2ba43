"""The simulated driver's MIG capability nodes: what a node's /dev and /proc/driver hold for its MIG devices."""

from __future__ import annotations

import pytest
from gpunode_sim.node.simnode import CAPS_MAJOR, driver_files
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile


def files(faults: list[str], mig: list[str] | None = None) -> tuple[dict[str, str], list[list]]:
    profile = load_profile("a100x4-containerd")
    if mig is not None:
        profile = dict(profile, gpu=dict(profile["gpu"], mig=mig))
    proc, _, devices = driver_files(driver_state("node01", dict(profile, faults=faults)))
    return proc, devices


def caps(devices: list[list]) -> list[str]:
    return [name for name, major, _, _ in devices if name.startswith("nvidia-caps/") and major == CAPS_MAJOR]


def test_mig_devices_come_with_their_capability_nodes() -> None:
    proc, devices = files([], ["1g.5gb", "1g.5gb"])
    minors = dict(line.split(" ") for line in proc["nvidia-caps/mig-minors"].splitlines())
    assert (minors["config"], minors["monitor"], minors["gpu0/gi0/access"], minors["gpu0/gi0/ci0/access"]) == \
        ("1", "2", "3", "4")  # as NVIDIA's toolkit tests have them
    # the profile's layout on each of the four GPUs: GPU instances 1 and 2, compute instance 0 in each
    wanted = {minors["config"], minors["monitor"]} | {
        minors[f"gpu{gpu}/gi{gi}/{cap}"] for gpu in range(4) for gi in (1, 2) for cap in ("access", "ci0/access")}
    assert sorted(caps(devices)) == sorted(f"nvidia-caps/nvidia-cap{m}" for m in wanted)


@pytest.mark.parametrize(("faults", "mig", "mig_devices", "nodes"), [
    (["mig-caps-missing"], None, 2, 0),  # the fault makes two MIG devices on GPU 0 and no node for them
    ([], None, 0, 0),  # no MIG: neither the minors file nor a node
])
def test_the_fault_leaves_the_mig_devices_without_nodes(faults: list[str], mig: list[str] | None, mig_devices: int,
                                                          nodes: int) -> None:
    state = driver_state("node01", dict(load_profile("a100x4-containerd"), faults=faults))
    assert len(state["gpus"][0]["mig_devices"]) == mig_devices
    proc, devices = files(faults, mig)
    assert len(caps(devices)) == nodes
    assert ("nvidia-caps/mig-minors" in proc) == bool(mig_devices)
