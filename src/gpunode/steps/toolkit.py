"""Step 3: the four NVIDIA Container Toolkit packages at the pinned version."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.host_settings import settings_of
from gpunode.operations import toolkit
from gpunode.steps.runtime import RUN_STAMP


@deploy("Toolkit install")
def toolkit_install() -> None:
    settings = settings_of(host).node
    toolkit.pinned(name="Install the NVIDIA Container Toolkit at the pinned version", settings=settings,
                   stamp=RUN_STAMP)
    toolkit.usable(name="Make the toolkit's config and programs usable on this host", stamp=RUN_STAMP,
                   settings=settings)
