"""Verification of the toolkit step (see gpunode.diagnosis.toolkit for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_toolkit(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "toolkit")
