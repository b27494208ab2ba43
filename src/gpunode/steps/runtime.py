"""Steps 4 and 5: configure the container runtime for nvidia, restart it only if that changed it."""

from __future__ import annotations

from datetime import UTC, datetime

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.host_settings import settings_of
from gpunode.operations import runtime

# One backup folder per run, the same on every host: /var/backups/gpunode/<RUN_STAMP>/
RUN_STAMP = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


@deploy("Runtime configuration")
def runtime_configuration() -> None:
    settings = settings_of(host).node
    configure = runtime.nvidia_runtime(name="Configure the container runtime for the nvidia runtime",
                                       settings=settings, stamp=RUN_STAMP)
    runtime.restarted(name="Restart the container runtime (its config changed)", settings=settings,
                      stamp=RUN_STAMP, _if=configure.did_change)
    runtime.rechecked(name="Re-check the runtime after the change", settings=settings, _if=configure.did_change)
