"""Verification of the driver step (see gpunode.diagnosis.driver for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_driver(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "driver")
