"""A node's GPUs as Dynamic Resource Allocation devices: its ResourceSlice and the driver's DeviceClasses.

The driver is ``gpu.gpunode.io`` (a domain gpunode owns, so its attribute names cannot collide with NVIDIA's
``gpu.nvidia.com``). Each physical GPU is one device, ``gpu-<index>``; a GPU in MIG mode is offered as its MIG
devices instead, ``gpu-<index>-mig-<gpu instance>-<compute instance>``, as NVIDIA's own DRA driver models MIG
(fixed devices, created by the administrator) rather than as partitionable devices with shared counters, which
would let the scheduler create MIG layouts that nothing on the node creates. The attributes are the ones a
selector needs to pick a GPU (unqualified names, so in the driver's domain): ``type`` (gpu or mig), ``uuid``,
``productName``, ``index``, ``minor``, ``pciBusID``, ``cudaComputeCapability``, ``driverVersion`` and
``cudaDriverVersion`` (as semantic versions, so CEL can compare them), and ``profile`` and ``parentUUID`` for
MIG devices; the capacity is the device's ``memory``. A GPU the plugin's health check marked unhealthy leaves
the slice (the scheduler then allocates it to no new claim); the pool's generation moves with every change.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from gpunode_plugin.backend import Gpu, MigDevice

DRIVER = "gpu.gpunode.io"
API_VERSION = "resource.k8s.io/v1"
GPU_CLASS = DRIVER  # the DeviceClass of whole GPUs
MIG_CLASS = f"mig.{DRIVER}"  # and of MIG devices
VERSION = re.compile(r"^(\d+)(?:\.(\d+))?(?:\.(\d+))?$")


def semver(text: str) -> str | None:
    """A driver's dotted version as the semantic version DRA attributes take ("8.0" -> "8.0.0"), or None."""
    match = VERSION.match(text.strip())
    if not match:
        return None
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    return f"{major}.{minor}.{patch}"


def _common(gpu: Gpu) -> dict[str, dict]:
    attributes: dict[str, dict] = {"productName": {"string": gpu.name}, "pciBusID": {"string": gpu.pci_bus_id}}
    for name, text in (("cudaComputeCapability", gpu.compute_capability), ("driverVersion", gpu.driver_version),
                       ("cudaDriverVersion", gpu.cuda_version)):
        version = semver(text)
        if version:
            attributes[name] = {"version": version}
    return attributes


def gpu_device(gpu: Gpu) -> dict:
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, "index": {"int": gpu.index},
                  "minor": {"int": gpu.minor}, **_common(gpu)}
    return {"name": f"gpu-{gpu.index}", "attributes": attributes,
            "capacity": {"memory": {"value": f"{gpu.memory_mib}Mi"}}}


def mig_memory_mib(mig: MigDevice) -> int | None:
    """The MIG device's memory from its profile's name ("3g.40gb": 40 GiB), which is what NVIDIA names it by."""
    match = re.match(r"^\d+g\.(\d+)gb", mig.profile)
    return int(match.group(1)) * 1024 if match else None


def mig_device(mig: MigDevice, gpu: Gpu) -> dict:
    attributes = {"type": {"string": "mig"}, "uuid": {"string": mig.uuid}, "profile": {"string": mig.profile},
                  "parentUUID": {"string": gpu.uuid}, "index": {"int": gpu.index}, "minor": {"int": gpu.minor},
                  **_common(gpu)}
    device: dict = {"name": f"gpu-{gpu.index}-mig-{mig.gpu_instance}-{mig.compute_instance}",
                    "attributes": attributes}
    memory = mig_memory_mib(mig)
    if memory is not None:
        device["capacity"] = {"memory": {"value": f"{memory}Mi"}}
    return device


def devices(gpus: list[Gpu], unhealthy: Collection[str] = ()) -> list[dict]:
    """The node's devices in index order, without the unhealthy ones (by GPU or MIG UUID)."""
    found = []
    for gpu in sorted(gpus, key=lambda g: g.index):
        if gpu.mig_enabled:
            found += [mig_device(mig, gpu) for mig in gpu.mig_devices
                      if mig.uuid not in unhealthy and gpu.uuid not in unhealthy]
        elif gpu.uuid not in unhealthy:
            found.append(gpu_device(gpu))
    return found


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def resource_slice(node: str, gpus: list[Gpu], generation: int, unhealthy: Collection[str] = ()) -> dict:
    """The node's one ResourceSlice: pool ``node``, one slice in it, bound to the node."""
    return {"apiVersion": API_VERSION, "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node), "labels": {"app.kubernetes.io/managed-by": DRIVER}},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices(gpus, unhealthy)}}


def device_classes(extended_resource_name: str | None = None) -> list[dict]:
    """The DeviceClasses of whole GPUs and of MIG devices; ``extended_resource_name`` (e.g. ``nvidia.com/gpu``)
    lets a pod that asks for that extended resource be served whole GPUs through DRA (KEP-5004)."""
    def selector(kind: str) -> list[dict]:
        return [{"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                       f"device.attributes['{DRIVER}'].type == '{kind}'"}}]

    gpu_spec: dict = {"selectors": selector("gpu")}
    if extended_resource_name:
        gpu_spec["extendedResourceName"] = extended_resource_name
    return [{"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": GPU_CLASS}, "spec": gpu_spec},
            {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": MIG_CLASS},
             "spec": {"selectors": selector("mig")}}]
