"""Which device-plugin pod is a node's: the successor over a pod being deleted; for verify, never a pod on its way
out; for the deploy's waits, a pod being deleted still says that a successor is coming."""

from __future__ import annotations

import datetime

import pytest
from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpunode.facts import device_plugin
from gpunode.facts.device_plugin import being_deleted, read_plugin_pods


def pod(name: str, node: str, deleting: bool) -> Pod:
    stamp = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC) if deleting else None
    return Pod(metadata=ObjectMeta(name=name, deletionTimestamp=stamp), spec=PodSpec(containers=[], nodeName=node))


def listed(monkeypatch: pytest.MonkeyPatch, pods: list[Pod]) -> dict[str, Pod]:
    monkeypatch.setattr(device_plugin, "api_call", lambda settings, what, call: list(pods))
    return read_plugin_pods(None, "gpunode-system")  # type: ignore[arg-type]


def test_the_successor_is_the_nodes_pod_in_either_order(monkeypatch: pytest.MonkeyPatch) -> None:
    evicted, successor = pod("old", "node02", deleting=True), pod("new", "node02", deleting=False)
    assert listed(monkeypatch, [evicted, successor])["node02"].metadata.name == "new"
    assert listed(monkeypatch, [successor, evicted])["node02"].metadata.name == "new"


def test_a_pod_being_deleted_alone_is_listed_and_marked(monkeypatch: pytest.MonkeyPatch) -> None:
    found = listed(monkeypatch, [pod("old", "node02", deleting=True)])["node02"]
    assert being_deleted(found)  # verify and doctor drop it; the allocatable wait waits for its successor
    assert not being_deleted(pod("new", "node02", deleting=False)) and not being_deleted(None)
