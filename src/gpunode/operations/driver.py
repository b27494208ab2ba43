"""Operations of the driver step: check the NVIDIA driver, change nothing.

A failing check stops that host with the diagnosis (what, evidence, fix) while
the rest of the fleet goes on; a CPU-only host is reported and the GPU steps
after it skip themselves there (they ask ``gpu_present``).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import Host, operation

from gpunode.diagnosis import Verdict, failures
from gpunode.diagnosis.driver import REBOOT_REQUIRED, diagnose
from gpunode.facts.driver import DriverState
from gpunode.operations import failing_command, step_fact
from gpunode.operations.run_state import host_run
from gpunode.settings import NodeSettings

NO_GPU = "no working NVIDIA driver on this host (see the driver check): step skipped"


def driver_facts(target: Host) -> dict:
    """The host's driver facts, read once per run: the check, the labels and the device-plugin steps share them.

    (pyinfra fetches a fact again in each @deploy and again at execution; nothing before the driver
    check changes the driver, and a reboot in the run keeps its own facts: operations.reboot.)
    """
    run = host_run(target)
    if run.driver_facts is None:
        run.driver_facts = step_fact(target, "driver", DriverState)
    return run.driver_facts


def reboot_planned(target: Host) -> str | None:
    """Why this run reboots the host (a driver upgraded without reboot, ``reboot_on_mismatch``), or None."""
    return host_run(target).reboot


def gpu_present(target: Host) -> bool:
    """False where the driver check of this run found no working driver; GPU steps skip themselves then.

    A GPU operation used without a driver check before it (someone's own deploy) runs.
    """
    return host_run(target).gpu


@operation()
def checked(settings: NodeSettings):
    """
    Check the driver: nvidia-smi works and lists GPUs, the version is recent enough
    (configured minimum and the GPU generation's), the loaded module matches user
    space, device nodes exist, nouveau is not bound, NVSwitch nodes run a matching
    fabric manager with the fabric Completed.

    + settings: the host's gpunode settings (from inventory data)
    """
    state = driver_facts(host)
    findings = diagnose(state, settings)
    broken = failures(findings)
    if broken and settings.reboot_on_mismatch and all(f.code == REBOOT_REQUIRED for f in broken):
        host_run(host).gpu = True
        host_run(host).reboot = broken[0].what
        host.noop(f"{broken[0].what}: rebooting it (reboot_on_mismatch)")
        return
    if broken:
        host_run(host).gpu = False
        yield failing_command("\n".join(str(finding) for finding in broken))
        return
    if any(f.state is Verdict.NOT_CHECKED for f in findings):
        host_run(host).gpu = False
        host.noop(findings[0].what + "; GPU steps skipped on this host")
        return
    host_run(host).gpu = True
    for finding in findings:
        if finding.state is Verdict.FINDING and not finding.breaks:
            host.log_styled(f"warning: {finding.what}", fg="yellow", log_func=logger.warning)
    gpus = state["nvidia_smi"]["gpus"]
    host.noop(f"driver {gpus[0]['driver_version']} OK with {len(gpus)}x {gpus[0]['name']}")
