"""Step 1: the driver check (changes nothing)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.operations import driver
from gpunode.settings import NodeSettings


@deploy("Driver check")
def driver_check() -> None:
    """Stop hosts whose NVIDIA driver is broken, with what, evidence and fix; note CPU-only hosts."""
    driver.checked(name="Check the NVIDIA driver", settings=NodeSettings.from_data(host.data))
