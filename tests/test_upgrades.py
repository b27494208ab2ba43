"""Driver upgrades on the session fleet: reboot required, reboot_on_mismatch, rolling with max_unavailable.

Runs after tests/test_rollout.py (file order) on the bootstrapped fleet, and
leaves every node healthy (at the new driver) for tests/test_whole_chain.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import ApiError
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from .conftest import gpunode
from .test_provisioning import deploy, ssh
from .test_rollout import api, writes

pytestmark = pytest.mark.fleet
NAMESPACE = "gpunode-system"
NEW_DRIVER = "560.35.03"


def plugin_pods(fleet: dict) -> dict[str, str]:
    return {p.spec.nodeName: p.metadata.name for p in api(fleet).list(Pod, namespace=NAMESPACE)}


def boot_id(fleet: dict, node: str) -> str:
    return ssh(fleet, node, "cat /proc/sys/kernel/random/boot_id").strip()


@pytest.fixture(scope="module", autouse=True)
def no_gpu_pod_left(fleet: dict) -> Iterator[None]:
    """Whatever fails here, test 1's GPU pod and its budget do not outlive this file (they would hold a GPU of
    node01 for tests/test_whole_chain.py)."""
    yield
    client = api(fleet)
    for kind in (PodDisruptionBudget, Pod):
        try:
            client.delete(kind, "busy-a100", namespace="default", **({"grace_period": 0} if kind is Pod else {}))
        except ApiError as error:
            if error.status.code != 404:
                raise
    deadline = time.monotonic() + 60
    while [p for p in client.list(Pod, namespace="default") if p.metadata.name == "busy-a100"]:
        assert time.monotonic() < deadline, "busy-a100 was not deleted"
        time.sleep(0.5)


def wait_running(fleet: dict, name: str, timeout: float = 90) -> str:
    """The pod's phase once it is no longer Pending (a container start on a busy 2-core machine takes seconds)."""
    deadline = time.monotonic() + timeout
    while (phase := api(fleet).get(Pod, name, namespace="default").status.phase) == "Pending":
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return phase


def test_an_upgrade_without_reboot_is_reported_for_that_node_and_nothing_else_changes(
        fleet: dict, tmp_path: Path) -> None:
    holder = gpunode("sim", "run", "busy-a100", "--gpus", "1", "--node-selector", "accelerator=nvidia-a100",
                     "--timeout", "0", "--", "sleep", "900", env=fleet["env"], check=False)
    assert "pod default/busy-a100 on " in holder.stdout, holder.stdout + holder.stderr
    assert wait_running(fleet, "busy-a100") == "Running"
    assert api(fleet).get(Pod, "busy-a100", namespace="default").spec.nodeName == "node01"
    gpunode("sim", "driver", "node01", "--version", NEW_DRIVER, "--no-reboot", env=fleet["env"])
    assert "Driver/library version mismatch" in ssh(fleet, "node01", "nvidia-smi -L 2>&1 || true")
    before = len(writes(fleet))
    result, report = deploy(fleet, tmp_path)
    assert result.returncode == 1
    assert "driver upgraded without reboot" in result.stdout + result.stderr
    assert "reboot the node" in result.stdout + result.stderr
    assert report["node01"]["failed"]
    for other in ("node02", "node03"):
        assert not report[other]["changed"] and not report[other]["failed"], report
    assert len(writes(fleet)) == before  # no label, no cordon, nothing written to the cluster


def budget(min_available: int | None, max_unavailable: int | None) -> PodDisruptionBudget:
    spec = {"selector": {"matchLabels": {"app": "busy-a100"}}, "minAvailable": min_available,
            "maxUnavailable": max_unavailable}
    return PodDisruptionBudget.from_dict({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                                          "metadata": {"name": "busy-a100", "namespace": "default"},
                                          "spec": {k: v for k, v in spec.items() if v is not None}})


def wait_for_budget(fleet: dict) -> None:
    """Until the disruption controller has computed the budget (the eviction then answers by it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pdb = api(fleet).get(PodDisruptionBudget, "busy-a100", namespace="default")
        if pdb.status and pdb.status.observedGeneration == pdb.metadata.generation and pdb.status.expectedPods:
            return
        time.sleep(0.5)
    raise AssertionError("the disruption controller did not compute the budget")


def test_a_budget_that_forbids_the_eviction_stops_the_roll_there_and_leaves_the_node_cordoned(
        fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.patch(Pod, "busy-a100", {"metadata": {"labels": {"app": "busy-a100"}}}, namespace="default")
    client.create(budget(min_available=1, max_unavailable=None))
    wait_for_budget(fleet)
    result, report = deploy(fleet, tmp_path, "--data", "reboot_on_mismatch=true", "--data", "reboot_timeout=30")
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert ("GPU pods still on node01 after 30 s: default/busy-a100 (eviction refused: Cannot evict pod as it "
            "would violate the pod's disruption budget.") in output, output[-3000:]
    assert report["node01"]["failed"] and not report["node02"]["changed"], report
    node = client.get(Node, "node01")
    assert node.spec.unschedulable
    assert "driver" in node.metadata.annotations["gpunode.io/cordon-reason"]
    assert client.get(Pod, "busy-a100", namespace="default").status.phase == "Running"


def test_reboot_on_mismatch_drains_reboots_checks_and_uncordons(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.delete(PodDisruptionBudget, "busy-a100", namespace="default")
    # a budget that lets the pod go (a bare pod has no scale, so maxUnavailable could not allow anything)
    client.create(budget(min_available=0, max_unavailable=None))
    wait_for_budget(fleet)
    pods_before, boots_before = plugin_pods(fleet), {n: boot_id(fleet, n) for n in ("node01", "node02")}
    result, report = deploy(fleet, tmp_path, "--data", "reboot_on_mismatch=true")
    assert result.returncode == 0, result.stdout[-4000:]
    changed = " | ".join(report["node01"]["changed"])
    for step in ("Cordon the node", "Evict the node's GPU pods", "Reboot the node", "Uncordon the node",
                 "Label the Kubernetes node", "Restart the device plugin"):
        assert step in changed, changed
    assert not report["node02"]["changed"] and not report["node03"]["changed"], report
    node = client.get(Node, "node01")
    assert not (node.spec and node.spec.unschedulable)
    assert node.metadata.labels["nvidia.com/cuda.driver.major"] == "560"
    assert node.metadata.labels["nvidia.com/cuda.driver.minor"] == "35"
    assert node.status.allocatable["nvidia.com/gpu"] == "4"
    assert boot_id(fleet, "node01") != boots_before["node01"] and boot_id(fleet, "node02") == boots_before["node02"]
    pods_after = plugin_pods(fleet)
    assert pods_after["node01"] != pods_before["node01"] and pods_after["node02"] == pods_before["node02"]
    assert "evicted default/busy-a100" in result.stdout + result.stderr  # test 1's GPU pod, still running there
    assert [p for p in client.list(Pod, namespace="default") if p.metadata.name == "busy-a100"] == []
    assert deploy(fleet, tmp_path, "--data", "reboot_on_mismatch=true")[1]["node01"]["changed"] == []


def test_a_roll_stops_at_the_node_that_fails_and_leaves_it_cordoned(fleet: dict, tmp_path: Path) -> None:
    gpunode("sim", "fault", "node02", "library-mismatch", env=fleet["env"])  # survives reboots: the reboot fails
    try:
        result, report = deploy(fleet, tmp_path, "--data", "reboot_on_mismatch=true", "--data", "max_unavailable=1",
                                "--data", "reboot_timeout=60")
        assert result.returncode == 1
        assert report["node01"]["failed"] == [] and report["node01"]["changed"] == []
        assert report["node02"]["failed"]
        assert report["node03"]["skipped"] == "roll stopped: node02 failed" and not report["node03"]["changed"]
        assert "not started (roll stopped: node02 failed)" in result.stdout
        node = api(fleet).get(Node, "node02")
        assert node.spec.unschedulable is True
        assert node.metadata.annotations["gpunode.io/cordon-reason"].startswith("driver still broken after reboot")
    finally:
        gpunode("sim", "fault", "node02", "--clear", env=fleet["env"])
    result, report = deploy(fleet, tmp_path)  # the fault gone, the node is still cordoned: uncordon is a person's call
    assert result.returncode == 0, result.stdout[-3000:]
    api(fleet).patch(Node, "node02", {"spec": {"unschedulable": None}, "metadata": {"annotations": {
        "gpunode.io/cordon-reason": None}}}, field_manager="kubectl")
    assert json.loads(gpunode("doctor", "inventories/sim.py", "--json", env=fleet["env"], check=False).stdout)[
        "problems"] == []
