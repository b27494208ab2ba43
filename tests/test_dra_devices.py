"""The DRA driver's devices: each GPU (or its MIG devices) with the attributes a selector needs, health-filtered."""

from __future__ import annotations

import pytest
from gpunode_plugin.backend import Gpu, MigDevice
from gpunode_plugin.dra_devices import DRIVER, device_classes, devices, resource_slice, semver

A100 = Gpu(index=0, uuid="GPU-aaa", name="NVIDIA A100-SXM4-80GB", memory_mib=81920, minor=0,
           pci_bus_id="00000000:07:00.0", compute_capability="8.0", driver_version="550.54.15", cuda_version="12.4")
MIGGED = Gpu(index=1, uuid="GPU-bbb", name="NVIDIA A100-SXM4-80GB", memory_mib=81920, minor=1,
             pci_bus_id="00000000:0F:00.0", mig_enabled=True, compute_capability="8.0", driver_version="550.54.15",
             mig_devices=(MigDevice("MIG-b0", "3g.40gb", "1:0", 1, 0), MigDevice("MIG-b1", "1g.10gb", "1:1", 5, 0)))


@pytest.mark.parametrize(("text", "version"), [("8.0", "8.0.0"), ("550.54.15", "550.54.15"), ("12", "12.0.0"),
                                               ("", None), ("12.4-beta", None)])
def test_driver_versions_become_semantic_versions(text: str, version: str | None) -> None:
    assert semver(text) == version


def test_a_gpu_is_one_device_with_its_attributes_and_memory() -> None:
    [device] = devices([A100])
    assert device == {"name": "gpu-0", "capacity": {"memory": {"value": "81920Mi"}}, "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": "GPU-aaa"}, "index": {"int": 0}, "minor": {"int": 0},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "pciBusID": {"string": "00000000:07:00.0"},
        "cudaComputeCapability": {"version": "8.0.0"}, "driverVersion": {"version": "550.54.15"},
        "cudaDriverVersion": {"version": "12.4.0"}}}


def test_a_gpu_in_mig_mode_is_offered_as_its_mig_devices_and_unhealthy_ones_leave() -> None:
    found = devices([MIGGED, A100])
    assert [d["name"] for d in found] == ["gpu-0", "gpu-1-mig-1-0", "gpu-1-mig-5-0"]
    mig = found[1]
    assert mig["attributes"]["profile"] == {"string": "3g.40gb"} and mig["attributes"]["parentUUID"] == {
        "string": "GPU-bbb"} and mig["capacity"] == {"memory": {"value": "40960Mi"}}
    assert "cudaDriverVersion" not in mig["attributes"]  # the driver did not say: no attribute, never a guess
    assert [d["name"] for d in devices([MIGGED, A100], {"GPU-aaa", "MIG-b1"})] == ["gpu-1-mig-1-0"]
    assert devices([MIGGED], {"GPU-bbb"}) == []  # the whole GPU is unhealthy: none of its MIG devices


def test_the_nodes_slice_is_one_pool_of_one_slice_bound_to_it() -> None:
    body = resource_slice("node01", [A100], 3)
    assert body["spec"]["pool"] == {"name": "node01", "generation": 3, "resourceSliceCount": 1}
    assert (body["metadata"]["name"], body["spec"]["driver"], body["spec"]["nodeName"]) == (
        f"node01-{DRIVER}", DRIVER, "node01")


def test_the_gpu_class_can_serve_the_extended_resource() -> None:
    gpu, mig = device_classes("nvidia.com/gpu")
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu" and "extendedResourceName" not in mig["spec"]
    assert gpu["spec"]["selectors"][0]["cel"]["expression"] == (
        f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'")
    assert "extendedResourceName" not in device_classes()[0]["spec"]
