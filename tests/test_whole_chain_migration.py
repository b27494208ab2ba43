"""Migration on the session fleet: node01 served by a DaemonSet shaped like NVIDIA's static manifest, then moved.

Runs after tests/test_whole_chain.py (file order) on the bootstrapped fleet and leaves it as it found it.
The "NVIDIA" plugin is gpunode's own image under NVIDIA's names: DaemonSet
kube-system/nvidia-device-plugin-daemonset, pods labelled name=nvidia-device-plugin-ds, socket nvidia-gpu.sock
(NVIDIA's image needs a registry this machine does not have), pulled from the fleet's registry with a pull Secret
of its own in kube-system, as NVIDIA's plugin would have one there. The kubelet, the scheduler and the
DaemonSet controller that move the node are the real ones.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from gpunode_sim.cluster.controlplane import OPERATOR_USER
from lightkube import ApiError
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Node, Pod, Secret
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding

from .conftest import gpunode
from .test_provisioning import INVENTORY, deploy, verify
from .test_rollout import api
from .test_whole_chain import doctor

pytestmark = pytest.mark.fleet
NVIDIA = ("kube-system", "nvidia-device-plugin-daemonset")
LABEL = "gpunode.io/device-plugin"


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(1)


def nvidia_shaped(fleet: dict) -> DaemonSet:
    """NVIDIA's static manifest's names around the pod spec that runs on this fleet (gpunode's, as deployed)."""
    live = api(fleet).get(DaemonSet, "gpunode-device-plugin", namespace="gpunode-system").to_dict()
    spec = copy.deepcopy(live["spec"]["template"]["spec"])
    spec.pop("serviceAccountName", None)
    spec.pop("serviceAccount", None)
    spec["nodeSelector"] = {"accelerator": "nvidia-a100"}
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] == "device-plugins"]
    container = spec["containers"][0]
    container["args"] = [a.replace(":8081", ":8082") for a in container["args"] if not a.startswith("--config-file")]
    container["ports"] = [{"name": "http", "containerPort": 8082}]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] == "device-plugins"]
    container["env"] = [*container.get("env", []), {"name": "GPUNODE_PLUGIN_SOCKET_PREFIX", "value": "nvidia"}]
    labels = {"name": "nvidia-device-plugin-ds"}
    return DaemonSet.from_dict({"apiVersion": "apps/v1", "kind": "DaemonSet",
                                "metadata": {"name": NVIDIA[1], "namespace": NVIDIA[0]},
                                "spec": {"selector": {"matchLabels": labels},
                                         "template": {"metadata": {"labels": labels}, "spec": spec}}})


def pods_of(fleet: dict, namespace: str, labels: dict[str, str]) -> dict[str, Pod]:
    return {p.spec.nodeName: p for p in api(fleet).list(Pod, namespace=namespace, labels=labels)
            if not p.metadata.deletionTimestamp}


def ready(pod: Pod | None) -> bool:
    return bool(pod and pod.status and any(c.type == "Ready" and c.status == "True"
                                           for c in pod.status.conditions or []))


def allocatable(fleet: dict, node: str) -> str:
    return (api(fleet).get(Node, node).status.allocatable or {}).get("nvidia.com/gpu", "0")


@pytest.fixture(scope="module")
def served_by_nvidia(fleet: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """node01 as a cluster that runs NVIDIA's plugin has it; afterwards, everything back as gpunode serves it."""
    client = api(fleet)
    client.patch(Node, "node01", {"metadata": {"labels": {LABEL: None}}})  # gpunode's plugin leaves node01 first
    wait_for(lambda: "node01" not in pods_of(fleet, "gpunode-system",
                                             {"app.kubernetes.io/name": "gpunode-device-plugin"}),
             120, "gpunode's plugin pod to leave node01")
    secret = client.get(Secret, "gpunode-registry", namespace="gpunode-system")  # the registry's pull user
    client.create(Secret.from_dict({"apiVersion": "v1", "kind": "Secret", "type": secret.type,
                                    "metadata": {"name": "gpunode-registry", "namespace": NVIDIA[0]},
                                    "data": secret.data}))
    client.create(nvidia_shaped(fleet))
    try:
        wait_for(lambda: ready(pods_of(fleet, NVIDIA[0], {"name": "nvidia-device-plugin-ds"}).get("node01"))
                 and allocatable(fleet, "node01") == "4", 180, "NVIDIA's plugin to serve node01's 4 GPUs")
        yield
    finally:
        for kind, name, namespace in ((Pod, "trainer", "default"), (DaemonSet, NVIDIA[1], NVIDIA[0]),
                                      (Secret, "gpunode-registry", NVIDIA[0]),
                                      (RoleBinding, f"gpunode-migrate-{NVIDIA[1]}", NVIDIA[0]),
                                      (Role, f"gpunode-migrate-{NVIDIA[1]}", NVIDIA[0])):
            try:
                client.delete(kind, name, namespace=namespace)
            except ApiError as error:
                if error.status.code != 404:
                    raise
        result, _ = deploy(fleet, tmp_path_factory.mktemp("restore"))  # gpunode's label and plugin back
        assert result.returncode == 0, result.stdout[-3000:]
        wait_for(lambda: doctor(fleet)[0] == 0, 180, "a healthy fleet again")


def test_the_deploy_never_adds_a_second_registrar_and_says_which_daemonset_serves_the_node(
        fleet: dict, served_by_nvidia: None, tmp_path: Path) -> None:
    result, report = deploy(fleet, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert ("node node01: NVIDIA's device plugin kube-system/nvidia-device-plugin-daemonset (pod "
            "nvidia-device-plugin-daemonset-") in output and "gpunode does not add a second registrar" in output
    assert "'gpunode migrate INVENTORY --limit node01'" in output
    assert LABEL not in api(fleet).get(Node, "node01").metadata.labels
    assert "node01" not in pods_of(fleet, "gpunode-system", {"app.kubernetes.io/name": "gpunode-device-plugin"})
    code = gpunode("deploy", INVENTORY, "--dry", "--report", str(tmp_path / "dry.json"), env=fleet["env"],
                   check=False).returncode
    assert code == 0  # in sync: leaving NVIDIA's node alone is the plan, not drift
    _, results = verify(fleet, tmp_path)
    device_plugin = results["hosts"]["node01"]["device_plugin"]
    assert device_plugin["state"] == "not checked"
    assert "served by NVIDIA's device plugin kube-system/nvidia-device-plugin-daemonset" in device_plugin["reason"]
    assert results["hosts"]["node01"]["labels"]["state"] == "ok"


def test_two_registrars_on_one_node_are_named_with_the_other_daemonset(fleet: dict, served_by_nvidia: None) -> None:
    """Someone labels the node for gpunode's plugin by hand while NVIDIA's serves it: both register nvidia.com/gpu
    with the real kubelet, which keeps the last; doctor names the other DaemonSet and both ways out."""
    client = api(fleet)
    selector = {"app.kubernetes.io/name": "gpunode-device-plugin"}
    client.patch(Node, "node01", {"metadata": {"labels": {LABEL: "true"}}})
    try:
        wait_for(lambda: ready(pods_of(fleet, "gpunode-system", selector).get("node01")), 180,
                 "gpunode's plugin pod beside NVIDIA's on node01")
        code, report = doctor(fleet)
        assert code == 1
        found = next(p for p in report["problems"] if p["subject"] == "node01")
        assert (found["link"], found["code"]) == ("device_plugin", "two-registrars"), found
        assert "NVIDIA's kube-system/nvidia-device-plugin-daemonset" in found["what"]
        assert "gpunode migrate INVENTORY --limit node01" in found["fix"]
        assert any(line.startswith("daemonset kube-system/nvidia-device-plugin-daemonset: pod "
                                   "nvidia-device-plugin-daemonset-") for line in found["evidence"]), found
    finally:
        client.patch(Node, "node01", {"metadata": {"labels": {LABEL: None}}})
        wait_for(lambda: "node01" not in pods_of(fleet, "gpunode-system", selector), 120,
                 "gpunode's plugin pod to leave node01")
        # the kubelet kept the last registrar, which just left: NVIDIA's registers again when its pod restarts
        nvidia = pods_of(fleet, NVIDIA[0], {"name": "nvidia-device-plugin-ds"})["node01"]
        client.delete(Pod, nvidia.metadata.name, namespace=NVIDIA[0])
        wait_for(lambda: ready(pods_of(fleet, NVIDIA[0], {"name": "nvidia-device-plugin-ds"}).get("node01"))
                 and allocatable(fleet, "node01") == "4", 180, "NVIDIA's plugin to serve node01's 4 GPUs again")


def test_migrate_moves_one_node_with_its_running_gpu_pod_undisturbed(fleet: dict, served_by_nvidia: None) -> None:
    started = gpunode("sim", "run", "trainer", "--gpus", "1", "--node-selector", "accelerator=nvidia-a100",
                      "--timeout", "0", "--", "sleep", "900", env=fleet["env"], check=False)
    assert "pod default/trainer on " in started.stdout, started.stdout + started.stderr
    client = api(fleet)
    wait_for(lambda: client.get(Pod, "trainer", namespace="default").status.phase == "Running", 90, "trainer runs")
    before = client.get(Pod, "trainer", namespace="default")
    assert before.spec.nodeName == "node01"

    dry = gpunode("migrate", INVENTORY, "--limit", "node01", "--dry", env=fleet["env"], check=False)
    assert dry.returncode == 0 and "node01" in dry.stdout and "would move" in dry.stdout, dry.stdout + dry.stderr
    denied = gpunode("migrate", INVENTORY, "--limit", "node01", env=fleet["env"], check=False)
    assert denied.returncode == 1
    assert "RBAC denied" in denied.stdout and "daemonsets" in denied.stdout, denied.stdout + denied.stderr

    rbac = gpunode("render", INVENTORY, "--rbac", "--subject", f"User:{OPERATOR_USER}", "--migrate-from",
                   "/".join(NVIDIA), env=fleet["env"])
    for document in yaml.safe_load_all(rbac.stdout):
        if document["kind"] in ("Role", "RoleBinding") and document["metadata"]["namespace"] == NVIDIA[0]:
            client.create((Role if document["kind"] == "Role" else RoleBinding).from_dict(document))
    moved = gpunode("migrate", INVENTORY, "--limit", "node01", env=fleet["env"], check=False, timeout=600)
    output = moved.stdout + moved.stderr
    assert moved.returncode == 0, output
    assert "daemonset kube-system/nvidia-device-plugin-daemonset: required node affinity gpunode.io/device-plugin " \
           "DoesNotExist added" in output
    assert "1 running GPU pod(s) undisturbed (default/trainer)" in output
    assert "node01               node01               moved" in output

    after = client.get(Pod, "trainer", namespace="default")
    assert (after.metadata.uid, after.status.phase) == (before.metadata.uid, "Running")
    assert after.status.containerStatuses[0].restartCount == 0
    assert api(fleet).get(Node, "node01").metadata.labels[LABEL] == "true"
    assert "node01" not in pods_of(fleet, NVIDIA[0], {"name": "nvidia-device-plugin-ds"})
    assert ready(pods_of(fleet, "gpunode-system", {"app.kubernetes.io/name": "gpunode-device-plugin"}).get("node01"))
    assert allocatable(fleet, "node01") == "4"
    again = gpunode("migrate", INVENTORY, "--limit", "node01", env=fleet["env"], check=False)
    assert again.returncode == 0 and "already served by gpunode's plugin" in again.stdout
    code, report = doctor(fleet, "--node", "node01")
    assert code == 0, report
