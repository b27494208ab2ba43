"""The plugin's device specs for MIG devices: the parent GPU and its GPU and compute instance capability nodes, as
NVIDIA's plugin passes them with passDeviceSpecs (minors from the driver's mig-minors file)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpunode_plugin.allocation import AllocationError, container_response, mig_minors
from gpunode_plugin.backend import Gpu, MigDevice
from gpunode_plugin.config import Config
from gpunode_plugin.resources import build_resources

MINORS = "config 1\nmonitor 2\ngpu1/gi0/access 3\ngpu1/gi0/ci0/access 4\ngpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\n"


def mig_resource(config: Config) -> tuple:
    mig = MigDevice("MIG-aaa", "1g.5gb", "1:0", gpu_instance=2, compute_instance=0)
    gpu = Gpu(1, "GPU-1", "NVIDIA A100-SXM4-40GB", 40960, 1, "0000:0F:00.0", mig_enabled=True, mig_devices=(mig,))
    return build_resources([gpu], config)["nvidia.com/mig-1g.5gb"], mig


def test_a_mig_device_is_passed_with_its_capability_nodes(tmp_path: Path) -> None:
    (tmp_path / "mig-minors").write_text(MINORS)
    config = Config(mig_strategy="mixed", pass_device_specs=True, dev_root=str(tmp_path))
    resource, mig = mig_resource(config)
    response = container_response(resource, [mig.uuid], config, mig_minors(str(tmp_path / "mig-minors")))
    assert [d.container_path for d in response.devices] == [
        "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap21", "/dev/nvidia-caps/nvidia-cap22"]
    assert response.devices[1].host_path == f"{tmp_path}/dev/nvidia-caps/nvidia-cap21"


def test_a_capability_the_driver_does_not_list_refuses_the_allocation() -> None:
    config = Config(mig_strategy="mixed", pass_device_specs=True)
    resource, mig = mig_resource(config)
    with pytest.raises(AllocationError, match="no capability gpu1/gi2/access in /proc/driver/nvidia-caps/mig-minors"):
        container_response(resource, [mig.uuid], config, {})


def test_without_device_specs_nothing_is_read_or_passed() -> None:
    config = Config(mig_strategy="mixed")
    resource, mig = mig_resource(config)
    assert not container_response(resource, [mig.uuid], config, {}).devices
