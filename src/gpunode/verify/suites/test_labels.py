"""Verification of the labels step (see gpunode.diagnosis.labels for what is checked)."""

from gpunode.verify.engine import Verification
from gpunode.verify.plugin import check_step


def test_labels(gpunode_verification: Verification, gpunode_host: str) -> None:
    check_step(gpunode_verification, gpunode_host, "labels")
