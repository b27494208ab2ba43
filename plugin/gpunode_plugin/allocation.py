"""Allocate and GetPreferredAllocation, answered the way NVIDIA's plugin answers them."""

from __future__ import annotations

import itertools
import math
import os
import uuid as uuidlib

from gpunode_plugin.api import pb
from gpunode_plugin.config import Config
from gpunode_plugin.resources import LogicalDevice, Resource

CONTAINER_DEVICES = "/var/run/nvidia-container-devices"
# The CDI kind of the devices the CDI strategies name: the node's own spec's ("nvidia-ctk cdi generate" writes
# nvidia.com/gpu, each GPU by index and by UUID, MIG devices as "GPU:MIG" and by their UUID). NVIDIA's plugin names
# k8s.device-plugin.nvidia.com/gpu because it writes that spec itself; this plugin writes none, and a name of a
# kind no spec defines fails every container ("unresolvable CDI devices").
CDI_KIND = "nvidia.com/gpu"
MAX_COMBINATIONS = 5000  # beyond this, a greedy choice keeps GetPreferredAllocation in milliseconds
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"  # the driver's capability minors (procfs: global, as NVIDIA reads)


class AllocationError(Exception):
    """A request the plugin refuses; the kubelet fails the pod's admission with this text."""


def validate_request(resource: Resource, ids: list[str], config: Config) -> list[LogicalDevice]:
    unknown = [i for i in ids if i not in resource.devices]
    if unknown:
        raise AllocationError(f"invalid request: unknown device: {', '.join(unknown)}")
    if resource.shared and config.fail_requests_greater_than_one and len(ids) > 1:
        raise AllocationError(f"invalid request for {resource.name!r}: maximum request size for shared resources "
                              f"is 1, found {len(ids)}")
    return [resource.devices[i] for i in ids]


def mig_minors(path: str = MIG_MINORS) -> dict[str, int]:
    """``gpu0/gi1/access`` -> its nvidia-caps minor, from the driver's mig-minors file ({} where it is missing)."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        cap, _, minor = line.strip().partition(" ")
        if minor.isdigit():
            found[cap] = int(minor)
    return found


def mig_cap_paths(devices: list[LogicalDevice], minors: dict[str, int]) -> list[str]:
    """The capability device nodes of the MIG devices, as NVIDIA's plugin passes them (its GPU instance's and
    compute instance's access nodes); refuses a MIG device whose capability the driver does not list."""
    paths = []
    for device in devices:
        if device.mig is None:
            continue
        base = f"gpu{device.gpu.minor}/gi{device.mig.gpu_instance}"
        for cap in (f"{base}/access", f"{base}/ci{device.mig.compute_instance}/access"):
            if cap not in minors:
                raise AllocationError(f"MIG device {device.mig.uuid}: no capability {cap} in {MIG_MINORS}: its "
                                      "device node cannot be passed")
            paths.append(f"/dev/nvidia-caps/nvidia-cap{minors[cap]}")
    return paths


def container_response(resource: Resource, ids: list[str], config: Config,
                       minors: dict[str, int] | None = None) -> pb.ContainerAllocateResponse:
    """The answer for one container; ``minors`` (MIG capability minors) read from the driver when not given."""
    devices = validate_request(resource, ids, config)
    physical: list[LogicalDevice] = []
    seen = set()
    for device in devices:
        if device.physical_id not in seen:
            seen.add(device.physical_id)
            physical.append(device)
    names = [d.physical_id for d in physical]
    response = pb.ContainerAllocateResponse()
    strategies = config.device_list_strategy
    if "envvar" in strategies:
        response.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(names)
    if "volume-mounts" in strategies:
        response.envs["NVIDIA_VISIBLE_DEVICES"] = CONTAINER_DEVICES
        for name in names:
            response.mounts.add(host_path="/dev/null", container_path=f"{CONTAINER_DEVICES}/{name}")
    if "cdi-annotations" in strategies:
        key = f"{config.cdi_annotation_prefix}nvidia-device-plugin_{uuidlib.uuid4()}"
        response.annotations[key] = ",".join(f"{CDI_KIND}={name}" for name in names)
    if "cdi-cri" in strategies:
        for name in names:
            response.cdi_devices.add(name=f"{CDI_KIND}={name}")
    if config.pass_device_specs:
        root = config.device_root.rstrip("/")
        paths = [p for p in CONTROL_DEVICES if os.path.exists(root + p)]
        paths += sorted({f"/dev/nvidia{d.gpu.minor}" for d in physical})
        if any(d.mig for d in physical):
            paths += mig_cap_paths(physical, mig_minors() if minors is None else minors)
        for path in paths:
            response.devices.add(container_path=path, host_path=root + path, permissions="rw")
    return response


def preferred(resource: Resource, available: list[str], required: list[str], size: int,
              policy: str = "distributed") -> list[str]:
    """The best ``size`` devices: NVLink- and NUMA-aware on whole GPUs; on replicas by the shared-devices
    allocation ``policy`` (distributed: spread over GPUs, packed: fill GPUs); never raises."""
    try:
        chosen = _preferred(resource, available, required, size, policy)
        if len(chosen) == size:
            return chosen
    except Exception:  # noqa: BLE001 - GetPreferredAllocation must never fail pod admission
        pass
    return (list(required) + [i for i in available if i not in required])[:size]


def _pair_score(a: LogicalDevice, b: LogicalDevice) -> int:
    if a.gpu.uuid == b.gpu.uuid:
        return 60  # same board (two MIG devices or replicas of one GPU)
    score = 100 if b.gpu.uuid in a.gpu.nvlink_peers else 0
    if a.gpu.numa_node is not None and a.gpu.numa_node == b.gpu.numa_node:
        score += 20
    else:
        score += 10
    return score


def _preferred(resource: Resource, available: list[str], required: list[str], size: int,
               policy: str = "distributed") -> list[str]:
    devices = {i: resource.devices[i] for i in available if i in resource.devices}
    must = [i for i in required if i in devices]
    if resource.shared:
        return _spread_replicas(devices, must, size, packed=policy == "packed")
    rest = [i for i in devices if i not in must]
    need = size - len(must)
    if need <= 0:
        return must[:size]
    if math.comb(len(rest), need) > MAX_COMBINATIONS:
        chosen = list(must) or [rest.pop(0)]
        while len(chosen) < size and rest:
            best_id = max(rest, key=lambda i: sum(_pair_score(devices[i], devices[c]) for c in chosen))
            rest.remove(best_id)
            chosen.append(best_id)
        return chosen
    best: tuple[int, list[str]] | None = None
    for combo in itertools.combinations(rest, need):
        chosen = must + list(combo)
        score = sum(_pair_score(devices[a], devices[b]) for a, b in itertools.combinations(chosen, 2))
        if best is None or score > best[0]:
            best = (score, chosen)
    return best[1] if best else []


def _spread_replicas(devices: dict[str, LogicalDevice], must: list[str], size: int, packed: bool = False) \
        -> list[str]:
    """Take replicas one at a time: distributed from the GPU with the most free replicas (fewest allocated),
    packed from the one with the fewest free (most allocated), as NVIDIA's policies of those names."""
    chosen = list(must)
    taken_per_gpu: dict[str, int] = {}
    for i in must:
        taken_per_gpu[devices[i].physical_id] = taken_per_gpu.get(devices[i].physical_id, 0) + 1
    free: dict[str, list[str]] = {}
    for i, device in devices.items():
        if i not in chosen:
            free.setdefault(device.physical_id, []).append(i)
    while len(chosen) < size and any(free.values()):
        candidates = [g for g in free if free[g]]
        gpu = (min(candidates, key=lambda g: (len(free[g]) - taken_per_gpu.get(g, 0), g)) if packed else
               max(candidates, key=lambda g: (len(free[g]) - taken_per_gpu.get(g, 0), g)))
        chosen.append(free[gpu].pop(0))
        taken_per_gpu[gpu] = taken_per_gpu.get(gpu, 0) + 1
    return chosen
