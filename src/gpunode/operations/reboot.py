"""Operations of a reboot for a driver upgraded without one (``reboot_on_mismatch``).

Cordon the Kubernetes node, evict its GPU pods through the Eviction API (so
PodDisruptionBudgets are respected, within a timeout), reboot and wait until
the host is back with a new boot_id, check the driver again, uncordon. A node
whose driver is still broken after the reboot is left cordoned with the reason
in the annotation ``gpunode.io/cordon-reason``. The driver facts read after the
reboot are kept for the later steps of the same run (labels, allocatable GPUs).
"""

from __future__ import annotations

import logging
import time

from lightkube import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod
from paramiko.ssh_exception import SSHException
from pyinfra import host
from pyinfra.api import Host, operation

from gpunode import connection
from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call
from gpunode.diagnosis import failures
from gpunode.diagnosis.driver import REBOOT_REQUIRED, diagnose
from gpunode.errors import GpunodeError
from gpunode.facts.driver import DriverState
from gpunode.facts.labels import CORDON_REASON
from gpunode.operations import control_command
from gpunode.operations.driver import reboot_planned
from gpunode.operations.run_state import host_run
from gpunode.settings import NodeSettings

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
POLL_SECONDS = 2.0


def fresh_driver_state(target: Host) -> dict | None:
    """The driver facts read after this run rebooted the host; None when it did not."""
    return host_run(target).fresh_driver


def _run(target: Host, command: str) -> tuple[bool, list[str]]:
    status, stdout, _stderr = connection.run(target, command)
    return status, stdout


def set_unschedulable(target: Host, settings: ClusterSettings, node: str, cordon: bool, reason: str = "") -> None:
    patch = {"spec": {"unschedulable": True if cordon else None},
             "metadata": {"annotations": {CORDON_REASON: reason or None}}}
    api_call(settings, f"{'cordon' if cordon else 'uncordon'} node {node}",
             lambda client: client.patch(Node, node, patch, field_manager=FIELD_MANAGER))
    target.log(f"node {node} {'cordoned' if cordon else 'uncordoned'}" + (f": {reason}" if reason else ""))


def evict_gpu_pods(target: Host, settings: ClusterSettings, node: str, timeout: int) -> None:
    """Evict every pod on ``node`` that holds GPUs (DaemonSet pods stay, as kubectl drain leaves them)."""
    def gpu_pods(client) -> list[Pod]:
        found = []
        for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
            owners = pod.metadata.ownerReferences or []
            limits = [c.resources.limits or {} for c in pod.spec.containers if c.resources]
            done = pod.status and pod.status.phase in ("Succeeded", "Failed")
            claims = pod.spec.resourceClaims or []  # DRA: a pod holding a claim may hold GPUs through it
            if not done and not any(o.kind == "DaemonSet" for o in owners) and (claims or any(
                    k.startswith("nvidia.com/") for lim in limits for k in lim)):
                found.append(pod)
        return found

    deadline = time.monotonic() + timeout
    refused: dict[str, str] = {}  # ns/name -> the API server's last word on evicting it
    while True:
        pods = api_call(settings, f"list GPU pods on {node}", gpu_pods)
        if not pods:
            return
        for pod in pods:
            name = f"{pod.metadata.namespace}/{pod.metadata.name}"
            eviction = Pod.Eviction(metadata=ObjectMeta(name=pod.metadata.name, namespace=pod.metadata.namespace))
            try:
                api_call(settings, f"evict {name}",
                         lambda client, p=pod, e=eviction: client.create(e, p.metadata.name,
                                                                         namespace=p.metadata.namespace))
                target.log(f"evicted {name}")
            except GpunodeError as error:
                cause = error.__cause__
                if not (isinstance(cause, ApiError) and cause.status.code == 429):  # 429: a PDB says not yet
                    raise
                said = cause.status.message or ""
                causes = [c.message for c in ((cause.status.details.causes or []) if cause.status.details else [])
                          if c.message]
                refused[name] = " ".join([said, *causes]).strip()
        if time.monotonic() > deadline:
            names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]
            left = "; ".join(n + (f" (eviction refused: {refused[n]})" if n in refused else "") for n in names)
            raise GpunodeError(f"GPU pods still on {node} after {timeout} s: {left}",
                               "the node stays cordoned; relax the PodDisruptionBudget or move the pods by hand, "
                               "then re-run (or raise reboot_timeout)")
        time.sleep(POLL_SECONDS)


def reboot_and_wait(target: Host, timeout: int) -> None:
    ok, before = _run(target, BOOT_ID)
    if not ok or not before:
        raise GpunodeError("cannot read the boot id before rebooting", f"{BOOT_ID} failed on the host")
    target.log("rebooting")
    _run(target, "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &")
    time.sleep(3)
    target.disconnect()
    # paramiko logs each refused handshake with a traceback ("Error reading SSH protocol banner") while the host is
    # down: expected here, and said once below if the host does not come back
    transport_log = logging.getLogger("paramiko.transport")
    level = transport_log.level
    transport_log.setLevel(logging.CRITICAL)
    try:
        _wait_for_new_boot(target, before, timeout)
    finally:
        transport_log.setLevel(level)


def _wait_for_new_boot(target: Host, before: list[str], timeout: int) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        target.connect(show_errors=False)
        if target.connected:
            try:
                ok, now = _run(target, BOOT_ID)
            except (SSHException, OSError, EOFError):  # a machine still going down drops the session it accepted
                target.disconnect()
                ok, now = False, []
            if ok and now and now != before:
                target.log("back after the reboot")
                return
        time.sleep(POLL_SECONDS)
    raise GpunodeError(f"the host did not come back within {timeout} s of the reboot",
                       "check its console; raise reboot_timeout for slow firmware")


def recheck_driver(target: Host, settings: NodeSettings, cluster: ClusterSettings | None, node: str) -> None:
    """Read the driver facts again; broken: the node stays cordoned with the reason annotated."""
    fact = DriverState()
    _, lines = _run(target, fact.command())
    state = fact.process(lines)
    broken = failures(diagnose(state, settings))
    if broken:
        if cluster is not None:
            set_unschedulable(target, cluster, node, True, f"driver still broken after reboot: {broken[0].what}")
        raise GpunodeError(f"the driver is still broken after the reboot: {broken[0].what}",
                           "the node stays cordoned (gpunode.io/cordon-reason says why): if the module still differs, "
                           "the new driver's kernel module is not built for the running kernel (dkms status, "
                           "uname -r); fix it, reboot, re-run, or kubectl uncordon by hand"
                           if broken[0].code == REBOOT_REQUIRED else broken[0].fix)
    host_run(target).fresh_driver = state
    gpus = state["nvidia_smi"]["gpus"]
    target.log(f"driver {gpus[0]['driver_version']} OK with {len(gpus)} GPU(s) after the reboot")


def planned() -> bool:
    """True where this run reboots the host; the reboot operations are no-ops elsewhere."""
    if reboot_planned(host):
        return True
    host.noop("no reboot needed")
    return False


@operation()
def cordoned(node_name: str, settings: ClusterSettings):
    """
    Cordon the node (no new pods), the reason in the gpunode.io/cordon-reason annotation.

    + node_name: the Node's name
    + settings: which cluster
    """
    if planned():
        yield control_command(set_unschedulable, settings, node_name, True, reboot_planned(host))


@operation()
def drained(node_name: str, settings: ClusterSettings, timeout: int):
    """
    Evict the node's GPU pods (Eviction API: PodDisruptionBudgets are respected, up to ``timeout``).

    + node_name: the Node's name
    + settings: which cluster
    + timeout: seconds before giving up
    """
    if planned():
        yield control_command(evict_gpu_pods, settings, node_name, timeout)


@operation()
def rebooted(timeout: int):
    """
    Reboot the host and wait until it answers with a new boot_id.

    + timeout: seconds to wait for it to come back
    """
    if planned():
        yield control_command(reboot_and_wait, timeout)


@operation()
def driver_rechecked(settings: NodeSettings, cluster: ClusterSettings | None, node_name: str):
    """
    Check the driver again after the reboot; a node still broken stays cordoned, with the reason.

    + settings: the host's gpunode settings
    + cluster: which cluster (None: no Kubernetes steps)
    + node_name: the Node's name
    """
    if planned():
        yield control_command(recheck_driver, settings, cluster, node_name)


@operation()
def uncordoned(node_name: str, settings: ClusterSettings):
    """
    Make the node schedulable again and drop the cordon reason.

    + node_name: the Node's name
    + settings: which cluster
    """
    if planned():
        yield control_command(set_unschedulable, settings, node_name, False)
