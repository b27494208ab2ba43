"""Step 2: NVIDIA's Container Toolkit apt repository, key checked before it is trusted."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.host_settings import settings_of
from gpunode.operations import toolkit_repo
from gpunode.steps.runtime import RUN_STAMP


@deploy("Toolkit repository")
def toolkit_repository() -> None:
    toolkit_repo.configured(name="Configure the NVIDIA Container Toolkit apt repository",
                            settings=settings_of(host).node, stamp=RUN_STAMP)
