"""Verification of the runtime step (see gpunode.diagnosis.runtime for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_runtime(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "runtime")
