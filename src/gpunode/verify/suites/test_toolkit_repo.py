"""Verification of the toolkit_repo step (see gpunode.diagnosis.toolkit_repo for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_toolkit_repo(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "toolkit_repo")
