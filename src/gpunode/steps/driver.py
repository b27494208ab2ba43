"""Step 1: the driver check (changes nothing), and the reboot a driver upgraded without one needs.

With ``reboot_on_mismatch``, a host whose loaded kernel module differs from the
installed driver is cordoned, drained of GPU pods, rebooted, checked again and
uncordoned; without it, the host fails with "reboot required" and nothing
happens to it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy
from pyinfra.context import ctx_host
from pyinfra.facts.server import Hostname

from gpunode.cluster.client import ClusterSettings
from gpunode.host_settings import settings_of
from gpunode.operations import driver, read_node_facts, reboot, step_fact
from gpunode.operations.run_state import host_run


def node_name(settings: ClusterSettings) -> str:
    """The Kubernetes node name of this host: ``k8s_node_name`` in its data, else its hostname (read once)."""
    if settings.k8s_node_name:
        return settings.k8s_node_name
    target = ctx_host.get()
    run = host_run(target)
    if run.hostname is None:
        run.hostname = step_fact(target, "hostname", Hostname)
    return run.hostname


@deploy("Driver check")
def driver_check() -> None:
    """Stop hosts whose NVIDIA driver is broken, with what, evidence and fix; note CPU-only hosts."""
    settings = settings_of(host).node
    read_node_facts(host)  # every step's facts in one round trip; the steps after this one read their part
    driver.checked(name="Check the NVIDIA driver", settings=settings)
    if not settings.reboot_on_mismatch:
        return
    # Each of these does something only where the check above found a driver upgraded without reboot.
    cluster = settings_of(host).cluster
    name = node_name(cluster)
    if cluster.cluster_steps:
        reboot.cordoned(name="Cordon the node for its reboot", node_name=name, settings=cluster)
        reboot.drained(name="Evict the node's GPU pods", node_name=name, settings=cluster,
                       timeout=settings.reboot_timeout)
    reboot.rebooted(name="Reboot the node and wait for it", timeout=settings.reboot_timeout)
    reboot.driver_rechecked(name="Check the driver after the reboot", settings=settings,
                            cluster=cluster if cluster.cluster_steps else None, node_name=name)
    if cluster.cluster_steps:
        reboot.uncordoned(name="Uncordon the node", node_name=name, settings=cluster)
