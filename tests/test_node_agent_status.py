"""The simulator's node agent posts a pod's status again when another writer changed it in the API.

Seen at 100 simulated nodes under load: a node missed its lease, the node lifecycle controller marked its
device-plugin pod not ready, and the agent, whose own view had not changed, never posted Ready again: the
rollout waited for that pod until its timeout. A kubelet reconciles with what the API holds.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from gpunode_sim.guest.kubelet_agent import Agent, Container

KEY = "gpunode-system/gpunode-device-plugin-abcde"


class FakeApi:
    def __init__(self) -> None:
        self.posted: list[dict] = []

    def pod_status(self, namespace: str, name: str, status: dict) -> None:
        self.posted.append(status)


def agent_with_a_ready_plugin() -> tuple[Agent, FakeApi]:
    agent = Agent.__new__(Agent)  # no node, no sockets: only the status bookkeeping is under test
    api = FakeApi()
    agent.api, agent.lock, agent.sent, agent.workloads = api, threading.RLock(), {}, {}
    agent.facts = SimpleNamespace(address="10.230.0.45", name="node45")
    container = Container(KEY, {"name": "nvidia-device-plugin", "image": "gpunode-device-plugin:0.1.0"})
    container.process, container.ready, container.started_stamp = SimpleNamespace(), True, "2026-12-01T22:00:00Z"
    agent.containers = {KEY: container}
    return agent, api


def pod(conditions: list[dict] | None = None) -> dict:
    return {"metadata": {"namespace": "gpunode-system", "name": "gpunode-device-plugin-abcde", "uid": "u1"},
            "spec": {"containers": [{"name": "nvidia-device-plugin"}]},
            "status": {"conditions": conditions or []}}


def test_a_status_changed_by_another_writer_is_posted_again():
    agent, api = agent_with_a_ready_plugin()
    agent.post_statuses({KEY: pod()})
    assert len(api.posted) == 1
    held = api.posted[0]["conditions"]
    assert {c["type"]: c["status"] for c in held}["Ready"] == "True"

    agent.post_statuses({KEY: pod(held)})  # the API holds what was posted: nothing to do
    assert len(api.posted) == 1

    marked = [{**c, "status": "False"} if c["type"] == "Ready" else c for c in held]
    agent.post_statuses({KEY: pod(marked)})  # the node lifecycle controller marked it not ready
    assert len(api.posted) == 2
    assert {c["type"]: c["status"] for c in api.posted[1]["conditions"]}["Ready"] == "True"
