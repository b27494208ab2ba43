"""Verification of the device-plugin step (see gpunode.diagnosis.device_plugin for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_device_plugin(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "device_plugin")
