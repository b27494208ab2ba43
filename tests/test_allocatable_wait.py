"""The allocatable check after this run restarted a node's device plugin (its driver changed).

The old pod's registration can still be what the Node says: the check must wait for the NEW pod (another
name) to be ready before it believes the number, and must fail the host when the deadline passes without a
match, even when no cause is diagnosed.
"""

from __future__ import annotations

import pytest

from gpunode.cluster.client import ClusterSettings
from gpunode.cluster.manifests import ManifestSettings
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import PluginPodState, RolloutState
from gpunode.facts.labels import NodeLabelsState
from gpunode.operations import device_plugin as operation

FOUR_GPUS = [{"index": i, "mig_mode": "Disabled"} for i in range(4)]


class FakeHost:
    def __init__(self) -> None:
        self.said: list[str] = []

    def log(self, message: str) -> None:
        self.said.append(message)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the API answers, call after call: the plugin pods seen on the node and its allocatable GPUs."""
    answers: dict = {"pods": [], "allocatable": [], "node_reads": 0}

    def read_plugin_pod(settings: ClusterSettings, namespace: str, node: str) -> PluginPodState:
        pods = answers["pods"]
        return pods.pop(0) if len(pods) > 1 else pods[0]

    def read_node(settings: ClusterSettings, name: str) -> NodeLabelsState:
        answers["node_reads"] += 1
        counts = answers["allocatable"]
        count = counts.pop(0) if len(counts) > 1 else counts[0]
        return NodeLabelsState(name, True, allocatable={"nvidia.com/gpu": str(count)})

    monkeypatch.setattr(operation, "read_plugin_pod", read_plugin_pod)
    monkeypatch.setattr(operation, "read_node", read_node)
    monkeypatch.setattr(operation, "read_rollout", lambda settings, namespace: RolloutState(True, 1, 1, 1, 1, 1))
    monkeypatch.setattr(operation, "POLL_SECONDS", 0.01)
    return answers


def test_the_old_pods_numbers_do_not_count(cluster: dict) -> None:
    target = FakeHost()
    operation._replaced[target] = "plugin-old"
    cluster["pods"] = [PluginPodState("node01", "plugin-old", "Running", True),  # not yet deleted
                       PluginPodState("node01", "plugin-new", "Running", False),
                       PluginPodState("node01", "plugin-new", "Running", True)]
    cluster["allocatable"] = [4, 0, 4]  # the old registration, the gap, the new one
    operation.wait_allocatable(target, ClusterSettings(allocatable_timeout=5), "node01", FOUR_GPUS,
                               ManifestSettings())
    assert cluster["node_reads"] == 3
    assert target.said == ["node01: 4 allocatable nvidia.com/gpu (from the new plugin pod plugin-new)"]


def test_no_match_by_the_deadline_fails_the_host_even_without_a_cause(cluster: dict, monkeypatch) -> None:
    target = FakeHost()
    monkeypatch.setattr(operation, "diagnose", lambda *args: [])
    cluster["pods"] = [PluginPodState("node01", "plugin-a", "Running", True)]
    cluster["allocatable"] = [3]
    with pytest.raises(GpunodeError, match=r"node01 offers 3 allocatable nvidia.com/gpu, 4 expected \(driver "
                                           r"\(nvidia-smi\): 4 GPU\(s\).*\), after 1 s"):
        operation.wait_allocatable(target, ClusterSettings(allocatable_timeout=1), "node01", FOUR_GPUS,
                                   ManifestSettings())
