"""The allocatable check after this run restarted a node's device plugin (its driver changed).

The old pod's registration can still be what the Node says: the check must wait for the NEW pod (another
name) to be ready before it believes the number, and must fail the host when the deadline passes without a
match, even when no cause is diagnosed.
"""

from __future__ import annotations

import threading
import time

import httpx2
import pytest
from lightkube.models.core_v1 import (
    Container,
    ContainerState,
    ContainerStateWaiting,
    ContainerStatus,
    PodSpec,
    PodStatus,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.manifests import ManifestSettings
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import PluginPodState, RolloutState
from gpunode.facts.labels import NodeLabelsState
from gpunode.operations import device_plugin as operation
from gpunode.operations.run_state import host_run

FOUR_GPUS = [{"index": i, "mig_mode": "Disabled"} for i in range(4)]


class FakeHost:
    def __init__(self) -> None:
        self.said: list[str] = []

    def log(self, message: str) -> None:
        self.said.append(message)


def plugin_pod(name: str, ready: bool) -> Pod:
    return Pod(metadata=ObjectMeta(name=name), spec=PodSpec(containers=[], nodeName="node01"),
               status=PodStatus(phase="Running", containerStatuses=[
                   ContainerStatus(name="nvidia-device-plugin", ready=ready, restartCount=0, image="", imageID="")]))


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the run's shared poll of the API answers, poll after poll: node01's plugin pod and allocatable GPUs."""
    answers: dict = {"pods": [], "allocatable": [], "polls": 0, "errors": []}

    def poll_cluster(settings: ClusterSettings, namespace: str) -> operation.ClusterPoll:
        answers["polls"] += 1
        if answers["errors"]:
            raise answers["errors"].pop(0)
        pods, counts = answers["pods"], answers["allocatable"]
        pod = pods.pop(0) if len(pods) > 1 else pods[0]
        count = counts.pop(0) if len(counts) > 1 else counts[0]
        node = NodeLabelsState("node01", True, allocatable={"nvidia.com/gpu": str(count)})
        return operation.ClusterPoll(0.0, {"node01": node}, {"node01": pod} if pod else {},
                                     RolloutState(True, 1, 1, 1, 1, 1))

    monkeypatch.setattr(operation, "poll_cluster", poll_cluster)
    monkeypatch.setattr(operation, "POLL_SECONDS", 0.01)
    return answers


def test_the_old_pods_numbers_do_not_count(cluster: dict) -> None:
    target = FakeHost()
    host_run(target).replaced = "plugin-old"  # the run's record: this run deleted that pod
    cluster["pods"] = [plugin_pod("plugin-old", True),  # not yet deleted
                       plugin_pod("plugin-new", False),
                       plugin_pod("plugin-new", True)]
    cluster["allocatable"] = [4, 0, 4]  # the old registration, the gap, the new one
    operation.wait_allocatable(target, ClusterSettings(allocatable_timeout=5), "node01", FOUR_GPUS,
                               ManifestSettings())
    assert cluster["polls"] == 3
    assert target.said == ["node01: 4 allocatable nvidia.com/gpu (from the new plugin pod plugin-new)"]


def test_no_match_by_the_deadline_fails_the_host_even_without_a_cause(cluster: dict, monkeypatch) -> None:
    target = FakeHost()
    monkeypatch.setattr(operation, "diagnose", lambda *args: [])
    cluster["pods"] = [plugin_pod("plugin-a", True)]
    cluster["allocatable"] = [3]
    with pytest.raises(GpunodeError, match=r"node01 offers 3 allocatable nvidia.com/gpu, 4 expected \(driver "
                                           r"\(nvidia-smi\): 4 GPU\(s\).*\), after 1 s"):
        operation.wait_allocatable(target, ClusterSettings(allocatable_timeout=1), "node01", FOUR_GPUS,
                                   ManifestSettings())


def test_an_api_timeout_is_retried_until_the_deadline(cluster: dict) -> None:
    target = FakeHost()
    timeout = GpunodeError("list nodes: cannot reach the Kubernetes API at https://127.0.0.1:6443 "
                           "(The read operation timed out)")
    timeout.__cause__ = httpx2.ReadTimeout("The read operation timed out")
    cluster["errors"] = [timeout, timeout]
    cluster["pods"] = [plugin_pod("plugin-a", True)]
    cluster["allocatable"] = [4]
    operation.wait_allocatable(target, ClusterSettings(allocatable_timeout=5), "node01", FOUR_GPUS,
                               ManifestSettings())
    assert cluster["polls"] == 3
    assert len([line for line in target.said if "retrying" in line]) == 1  # said once, not per poll
    assert target.said[-1] == "node01: 4 allocatable nvidia.com/gpu"


def test_an_api_refusal_is_not_retried(cluster: dict) -> None:
    refused = GpunodeError("list nodes: RBAC denied: nodes is forbidden")
    cluster["errors"] = [refused]
    with pytest.raises(GpunodeError, match="RBAC denied.*while waiting for node01's allocatable GPUs"):
        operation.wait_allocatable(FakeHost(), ClusterSettings(allocatable_timeout=5), "node01", FOUR_GPUS,
                                   ManifestSettings())
    assert cluster["polls"] == 1


def test_every_hosts_wait_shares_one_poll_of_the_api(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"nodes": 0, "pods": 0, "rollout": 0}

    def count(kind: str, value: object):
        def read(*args: object) -> object:
            calls[kind] += 1
            time.sleep(0.05)  # an API answer takes a moment: the other hosts wait for it instead of asking again
            return value
        return read

    monkeypatch.setattr(operation, "read_nodes", count("nodes", {}))
    monkeypatch.setattr(operation, "read_plugin_pods", count("pods", {}))
    monkeypatch.setattr(operation, "read_rollout", count("rollout", RolloutState(True, 1, 1, 1, 1, 1)))
    settings = ClusterSettings(kubeconfig="/tmp/poll-test-kubeconfig")
    polls: list[operation.ClusterPoll] = []
    threads = [threading.Thread(target=lambda: polls.append(operation.poll_cluster(settings, "gpunode-system")))
               for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(polls) == 50
    assert calls == {"nodes": 1, "pods": 1, "rollout": 1}
    assert len({id(poll) for poll in polls}) == 1
    assert polls[0].node("node07").exists is False


def backing_off(name: str, image: str) -> Pod:
    waiting = ContainerState(waiting=ContainerStateWaiting(reason="ImagePullBackOff", message="not found"))
    return Pod(metadata=ObjectMeta(name=name), spec=PodSpec(containers=[Container(name="plugin", image=image)],
                                                             nodeName="node01"),
               status=PodStatus(phase="Pending", containerStatuses=[
                   ContainerStatus(name="plugin", ready=False, restartCount=0, image=image, imageID="",
                                   state=waiting)]))


def test_the_rollout_wait_leaves_a_pod_of_the_older_template_to_the_controller(monkeypatch) -> None:
    """A deploy repairing a wrong image: the old pod backs off until the DaemonSet controller replaces it."""
    new = "registry.test/plugin@sha256:" + "a" * 64
    rollouts = [RolloutState(True, 2, 2, 1, 0, 0, image=new), RolloutState(True, 2, 2, 1, 1, 1, image=new)]
    monkeypatch.setattr(operation, "read_rollout", lambda settings, namespace: rollouts.pop(0))
    monkeypatch.setattr(operation, "read_plugin_pods",
                        lambda settings, namespace: {"node01": backing_off("plugin-old", "registry.test/plugin:gone")})
    monkeypatch.setattr(operation, "POLL_SECONDS", 0.01)
    target = FakeHost()
    operation.wait_rollout(target, ClusterSettings(rollout_timeout=5), "gpu")
    assert target.said[-1] == "device plugin rolled out: 1/1 ready, 1/1 updated"


def test_the_rollout_wait_names_a_pod_of_the_current_template_that_cannot_pull(monkeypatch) -> None:
    new = "registry.test/plugin:gone"
    monkeypatch.setattr(operation, "read_rollout", lambda settings, namespace: RolloutState(True, 2, 2, 1, 1, 0,
                                                                                            image=new))
    monkeypatch.setattr(operation, "read_plugin_pods",
                        lambda settings, namespace: {"node01": backing_off("plugin-new", new)})
    monkeypatch.setattr(operation, "plugin_pod_state", lambda settings, namespace, node, pod: PluginPodState(
        node, pod.metadata.name, "Pending", waiting="ImagePullBackOff", waiting_message="not found", image=new))
    with pytest.raises(GpunodeError, match="cannot pull the device plugin's image registry.test/plugin:gone"):
        operation.wait_rollout(FakeHost(), ClusterSettings(rollout_timeout=5), "gpu")
