"""Which device-plugin pod is a node's: a pod being deleted is not, even while its process still runs."""

from __future__ import annotations

import datetime

from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpunode.facts.device_plugin import live


def pod(name: str, node: str, deleting: bool) -> Pod:
    stamp = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC) if deleting else None
    return Pod(metadata=ObjectMeta(name=name, deletionTimestamp=stamp), spec=PodSpec(containers=[], nodeName=node))


def test_a_pod_being_deleted_is_not_the_nodes_plugin() -> None:
    evicted = pod("gpunode-device-plugin-old", "node02", deleting=True)
    successor = pod("gpunode-device-plugin-new", "node02", deleting=False)
    assert live([evicted, successor]) == [successor]
    assert live([evicted]) == []  # tainted away with no successor: no plugin runs there for verify and doctor
    assert live([successor]) == [successor]
