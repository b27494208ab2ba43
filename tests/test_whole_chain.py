"""The whole chain on the session fleet: GPU pods, the API's GPU spec checks, and doctor on injected faults.

Runs after tests/test_rollout.py (file order): every node is bootstrapped and
the device plugin is rolled out. Each fault starts from that clean state, is
injected alone, and is repaired (by a re-run of the deploy, or by clearing the
fault) before the next; doctor must name the cause and the fix, and verify must
fail on the step that owns it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import tomlkit
import yaml
from gpunode_sim.fleet import CHECKER_HEARTBEAT
from lightkube import ApiError
from lightkube.operators import exists
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod, ResourceQuota, ServiceAccount
from lightkube.resources.node_v1 import RuntimeClass

from gpunode.verify.node_conditions import CONDITIONS, camel

from .conftest import CONTAINERD_DEFAULT, block, gpunode
from .test_provisioning import INVENTORY, deploy, failing, ssh, verify
from .test_rollout import api

pytestmark = pytest.mark.fleet
NAMESPACE = "gpunode-system"


def doctor(fleet: dict, *args: str) -> tuple[int, dict]:
    result = gpunode("doctor", INVENTORY, "--json", *args, env=fleet["env"], check=False)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def problem(report: dict, subject: str) -> dict:
    found = [p for p in report["problems"] if p["subject"] == subject]
    assert found, report
    return found[0]


def run_pod(fleet: dict, name: str, *args: str) -> str:
    result = gpunode("sim", "run", name, *args, env=fleet["env"], check=False, timeout=120)
    return result.stdout + result.stderr


def wait_for(check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def test_doctor_on_a_healthy_fleet_reports_nothing(fleet: dict) -> None:
    code, report = doctor(fleet)
    assert code == 0 and report["problems"] == []
    assert report["nodes"]["node01"].startswith("ok") and "CPU-only" in report["nodes"]["node03"]


def test_every_ok_link_carries_the_evidence_that_proves_it(fleet: dict) -> None:
    links = doctor(fleet)[1]["links"]
    for node in ("node01", "node02"):
        states = {link["link"]: link["state"] for link in links[node]}
        assert states == dict.fromkeys(("driver", "toolkit_repo", "toolkit", "runtime", "labels", "device_plugin"),
                                       "ok"), links[node]
        assert all(link["evidence"] for link in links[node]), links[node]
    evidence = {link["link"]: " | ".join(link["evidence"]) for link in links["node01"]}
    assert "4 x NVIDIA A100-SXM4-40GB" in evidence["driver"]
    assert "nvidia BinaryName = '/usr/bin/nvidia-container-runtime' (set in /etc/containerd/" in \
        evidence["runtime"] and "ctr plugins ls: cri ok" in evidence["runtime"]
    assert "nvidia.com/gpu=4" in evidence["device_plugin"] and "spec.unschedulable not set" in evidence["device_plugin"]
    # written by the real nvidia-ctk in the package's post-install, as on a real Debian node (no Ubuntu ldconfig.real)
    assert '/etc/nvidia-container-runtime/config.toml: ldconfig = "@/sbin/ldconfig" (/sbin/ldconfig exists)' in \
        evidence["toolkit"] and "stat -c %a /usr/bin/nvidia-container-runtime: 755" in evidence["toolkit"]
    cpu = {link["link"]: link for link in links["node03"]}
    assert cpu["driver"]["state"] == "not checked" and "CPU-only" in cpu["driver"]["what"]
    assert cpu["no plugin on a CPU node"]["state"] == "ok"
    assert links["cluster"] == [{"link": "runtimeclass", "state": "ok", "what": 'the RuntimeClass "nvidia" exists',
                                 "evidence": ["kubectl get runtimeclass nvidia: handler nvidia"]}]
    text = gpunode("doctor", INVENTORY, env=fleet["env"]).stdout
    assert "  runtime                  ok           containerd runs with the nvidia runtime" in text, text


def workload(name: str, command: str, gpus: int = 0, node: str | None = None) -> Pod:
    container = {"name": "c", "image": "docker.io/library/gpunode-workload:1", "imagePullPolicy": "Never",
                 "command": ["sh", "-c", command]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    spec: dict = {"restartPolicy": "Never", "containers": [container]}
    if gpus:
        spec["runtimeClassName"] = "nvidia"
    if node:
        spec["nodeName"] = node
    return Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                          "spec": spec})


def test_doctor_calls_a_pod_ok_only_on_proof(fleet: dict) -> None:
    """Each of the first three was "ok: scheduled, started, and its container saw its GPUs" before."""
    client = api(fleet)
    pods = {"exit-three": workload("exit-three", "echo 'no input file'; exit 3"),
            # bound to node01 directly, more GPUs than it has: the real kubelet refuses it at admission
            "refused": workload("refused", "nvidia-smi -L", gpus=8, node="node01"),
            "quiet": workload("quiet", "true", gpus=1),
            "listed": workload("listed", "nvidia-smi -L", gpus=2)}
    for pod in pods.values():
        client.create(pod)
    try:
        def phases() -> dict[str, str]:
            return {name: client.get(Pod, name, namespace="default").status.phase for name in pods}
        deadline = time.monotonic() + 120
        while set(phases().values()) - {"Succeeded", "Failed"}:
            assert time.monotonic() < deadline, phases()
            time.sleep(1)
        code, report = doctor(fleet, "--pod", "default/exit-three")
        found = problem(report, "pod default/exit-three")
        assert (code, found["code"]) == (1, "pod-failed") and "exited 3" in found["what"]
        assert "container c: terminated (Error), exit code 3, ready=false, restarts=0" in found["evidence"]
        assert "container output: no input file" in found["evidence"]
        code, report = doctor(fleet, "--pod", "default/refused")
        found = problem(report, "pod default/refused")
        assert (code, found["code"]) == (1, "admission-refused"), found
        assert "reason UnexpectedAdmissionError: Pod was rejected: Allocate failed due to requested number of " \
               "devices unavailable for nvidia.com/gpu. Requested: 8, Available: 4" in found["evidence"][0], found
        code, report = doctor(fleet, "--pod", "default/quiet")
        states = [(link["link"], link["state"]) for link in report["links"]["pod default/quiet"]]
        assert (code, states) == (0, [("pod", "ok"), ("pod GPUs", "not checked")]), report
        code, report = doctor(fleet, "--pod", "default/listed")
        links = report["links"]["pod default/listed"]
        assert (code, [link["state"] for link in links]) == (0, ["ok", "ok"]), report
        assert sum(line.startswith("container output: GPU ") for line in links[1]["evidence"]) == 2
    finally:
        for name in pods:
            client.delete(Pod, name, namespace="default", grace_period=0)


def test_a_disabled_cri_plugin_is_named_and_not_restarted_over_and_over(fleet: dict, tmp_path: Path) -> None:
    """Before: doctor said "no nvidia runtime" and every deploy re-ran nvidia-ctk, restarted containerd and
    reported success."""
    ssh(fleet, "node01", "cp /etc/containerd/config.toml /root/config.cri.toml && sed -i "
        "'s/^disabled_plugins = \\[\\]/disabled_plugins = [\"io.containerd.grpc.v1.cri\"]/' "
        "/etc/containerd/config.toml && grep -q 'grpc.v1.cri\"]' /etc/containerd/config.toml && "
        "systemctl restart containerd")
    try:
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("runtime", "cri-disabled"), found
        assert "/etc/containerd/config.toml: disabled_plugins lists 'io.containerd.grpc.v1.cri'" in found["evidence"]
        started = ssh(fleet, "node01", "systemctl show -p ActiveEnterTimestampMonotonic containerd")
        for _ in range(2):
            result, report = deploy(fleet, tmp_path, "runtime", "--limit", "node01")
            assert result.returncode == 1 and "CRI plugin is disabled" in result.stdout + result.stderr
            assert report["node01"]["changed"] == [], report
        assert ssh(fleet, "node01", "systemctl show -p ActiveEnterTimestampMonotonic containerd") == started
    finally:
        ssh(fleet, "node01", "cp /root/config.cri.toml /etc/containerd/config.toml && systemctl restart containerd")
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_a_drop_in_that_changes_the_nvidia_runtime_is_named_with_its_file(fleet: dict, tmp_path: Path) -> None:
    """What the files say, what containerd runs with, and what the inventory wants: the file and key are named,
    and the deploy fails the host instead of re-running nvidia-ctk over a hand edit it cannot undo."""
    dropin = "/etc/containerd/conf.d/zz-admin.toml"
    imports = 'imports = ["/etc/containerd/conf.d/*.toml"]'
    # an admin's drop-in, sorted last: a copy of the effective CRI table (containerd replaces a plugin's whole
    # table with an imported one) in which nvidia's SystemdCgroup was changed by hand
    cri = tomlkit.parse(ssh(fleet, "node01", "containerd config dump"))["plugins"]["io.containerd.grpc.v1.cri"]
    runtimes = cri["containerd"]["runtimes"]
    runtimes["nvidia"]["options"]["SystemdCgroup"] = not runtimes["runc"]["options"].get("SystemdCgroup", False)
    document = tomlkit.document()
    document["version"] = 2
    document["plugins"] = {"io.containerd.grpc.v1.cri": cri}
    ssh(fleet, "node01", "cp /etc/containerd/config.toml /root/config.admin.toml && "
                         f"(grep -q '^imports' /etc/containerd/config.toml && sed -i 's|^imports = .*|{imports}|' "
                         f"/etc/containerd/config.toml || sed -i '1i {imports}' /etc/containerd/config.toml) && "
                         f"mkdir -p /etc/containerd/conf.d && cat > {dropin} <<'EOF'\n{tomlkit.dumps(document)}\nEOF\n"
                         "systemctl restart containerd")
    try:
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("runtime", "nvidia-options-differ"), found
        assert any(line.startswith("containerd config dump: options.SystemdCgroup: runc ")
                   and line.endswith(f"(set in {dropin})") for line in found["evidence"]), found
        result, report = deploy(fleet, tmp_path, "runtime", "--limit", "node01")
        assert result.returncode == 1 and report["node01"]["changed"] == [], report
        assert "runs containers differently from runc" in result.stdout + result.stderr
    finally:
        ssh(fleet, "node01", f"rm -f {dropin} && cp /root/config.admin.toml /etc/containerd/config.toml && "
                             "systemctl restart containerd")
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_stopped_containerd_is_said_at_once(fleet: dict) -> None:
    ssh(fleet, "node01", "systemctl stop containerd")
    try:
        began = time.monotonic()
        found = problem(doctor(fleet, "--node", "node01")[1], "node01")
        took = time.monotonic() - began
        assert found["code"] == "runtime-down" and "systemctl is-active containerd: inactive" in found["evidence"]
        assert took < 8, f"doctor took {took:.1f} s: a probe waited on the stopped containerd (ctr waits 10 s)"
    finally:
        ssh(fleet, "node01", "systemctl start containerd")
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_selector_key_added_by_another_manager_is_drift_the_deploy_repairs(fleet: dict, tmp_path: Path) -> None:
    """Before: the live DaemonSet held every rendered value, so deploy --dry planned nothing and could not repair."""
    client = api(fleet)
    client.patch(DaemonSet, "gpunode-device-plugin", {"spec": {"template": {"spec": {"nodeSelector": {
        "pool": "batch"}}}}}, namespace=NAMESPACE, field_manager="kubectl-patch")
    try:
        wait_for(lambda: client.get(Node, "node02").status.allocatable.get("nvidia.com/gpu") == "0", 60)
        found = problem(doctor(fleet)[1], "node02")
        assert found["code"] == "plugin-not-scheduled"
        assert "daemonset gpunode-system/gpunode-device-plugin nodeSelector: " \
            "gpunode.io/device-plugin=true,nvidia.com/gpu.present=true,pool=batch" \
            in found["evidence"] and "node node02 label pool=<missing>" in found["evidence"], found
        planned = deploy(fleet, tmp_path, "device_plugin", "--dry")[1]
        assert "Device plugin | Apply the device plugin's objects" in " ".join(
            c for host in planned.values() for c in host["changed"]), planned
        result, _ = deploy(fleet, tmp_path, "device_plugin")
        assert result.returncode == 0, result.stdout[-3000:]
        assert "removed from daemonset gpunode-device-plugin what another manager added: nodeSelector: pool" in \
            result.stdout + result.stderr
        selector = client.get(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE).spec.template.spec.nodeSelector
        assert selector == {"nvidia.com/gpu.present": "true", "gpunode.io/device-plugin": "true"}
    finally:
        client.patch(DaemonSet, "gpunode-device-plugin", {"spec": {"template": {"spec": {"nodeSelector": {
            "pool": None}}}}}, namespace=NAMESPACE, field_manager="kubectl-patch")
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_rollout_that_places_no_pod_on_the_gpu_nodes_is_not_done(fleet: dict, tmp_path: Path) -> None:
    """Before: desired == updated == ready == 0 passed as rolled out."""
    client = api(fleet)
    for node in ("node01", "node02"):
        client.patch(Node, node, {"spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}},
                     field_manager="kubectl")
    try:
        client.delete(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE)
        wait_for(lambda: not list(client.list(Pod, namespace=NAMESPACE)), 60)
        result, report = deploy(fleet, tmp_path, "device_plugin")
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "the device-plugin DaemonSet selects no node (0/0 ready, 0/0 updated) " \
            "while 2 GPU node(s) exist" in output, output[-3000:]
        assert "node01: gpunode.io/device-plugin=true, nvidia.com/gpu.present=true; taints dedicated=ml:NoSchedule" \
            in output, output[-3000:]
        assert "tolerations: nvidia.com/gpu:NoSchedule" in output
        found = problem(doctor(fleet)[1], "node01")
        assert found["code"] == "plugin-not-scheduled" and "kubectl taint node node01 dedicated-" in found["fix"]
    finally:
        for node in ("node01", "node02"):
            client.patch(Node, node, {"spec": {"taints": None}}, field_manager="kubectl")
    assert deploy(fleet, tmp_path)[0].returncode == 0
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_gpu_with_a_double_bit_ecc_error_is_named_with_the_plugins_words(fleet: dict) -> None:
    """Before: "some GPUs unhealthy (Xid) or missing": neither the GPU nor the cause named."""
    client = api(fleet)
    uuid = ssh(fleet, "node01", "nvidia-smi -L").splitlines()[1].split("UUID: ")[1].rstrip(")")
    events = "/run/gpunode-sim/events/health-events"
    ssh(fleet, "node01", f"echo '{uuid} ecc' >> {events}")
    try:
        wait_for(lambda: client.get(Node, "node01").status.allocatable.get("nvidia.com/gpu") == "3", 60)
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("device_plugin", "gpus-unhealthy"), found
        assert f"{uuid} (double-bit ECC error)" in found["what"], found
        assert f"plugin log: device {uuid} of nvidia.com/gpu unhealthy: double-bit ECC error" in found["evidence"]
        assert "PAGE_RETIREMENT" in found["fix"]
    finally:
        ssh(fleet, "node01", f": > {events}")
        for pod in client.list(Pod, namespace=NAMESPACE, fields={"spec.nodeName": "node01"}):
            client.delete(Pod, pod.metadata.name, namespace=NAMESPACE)  # NVIDIA's plugin too needs a restart
    wait_for(lambda: doctor(fleet)[0] == 0, 90)


def test_a_cordoned_gpu_node_and_the_pods_it_keeps_pending(fleet: dict) -> None:
    """Before: a node gpunode cordoned (with its reason) was reported "ok"."""
    client = api(fleet)
    reason = "driver 550.54.15 -> 550.90.07: reboot did not bring the new module up"
    client.patch(Node, "node02", {"spec": {"unschedulable": True},
                                  "metadata": {"annotations": {"gpunode.io/cordon-reason": reason}}},
                 field_manager="gpunode")
    try:
        code, report = doctor(fleet)
        found = problem(report, "node02")
        assert (code, found["link"], found["code"]) == (1, "device_plugin", "node-cordoned"), found
        assert f"annotation gpunode.io/cordon-reason: {reason}" in found["evidence"]
        run_pod(fleet, "on-v100", "--node-selector", "accelerator=nvidia-v100", "--timeout", "3")
        found = problem(doctor(fleet, "--pod", "default/on-v100")[1], "pod default/on-v100")
        assert found["code"] == "nodes-cordoned" and f"node02: spec.unschedulable = true, cordon reason: {reason}" \
            in found["evidence"], found
    finally:
        client.patch(Node, "node02", {"spec": {"unschedulable": None},
                                      "metadata": {"annotations": {"gpunode.io/cordon-reason": None}}},
                     field_manager="gpunode")
        client.delete(Pod, "on-v100", namespace="default", grace_period=0)
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_tainted_gpu_nodes_are_named_before_the_gpu_count(fleet: dict) -> None:
    """Before: "no node has that many free (most free: 8)", the taint in the event it quoted ignored."""
    client = api(fleet)
    for node in ("node01", "node02"):
        client.patch(Node, node, {"spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]}},
                     field_manager="kubectl")
    try:
        run_pod(fleet, "untolerated", "--timeout", "3")
        wait_for(lambda: any(e.reason == "FailedScheduling" for e in client.list(
            Event, namespace="default", fields={"involvedObject.name": "untolerated"})), 30)
        code, report = doctor(fleet, "--pod", "default/untolerated")
        found = problem(report, "pod default/untolerated")
        assert (code, found["code"]) == (1, "untolerated-taint"), found
        assert "node01: taints dedicated=ml:NoSchedule, not tolerated by the pod" in found["evidence"], found
        assert "{key: dedicated, operator: Equal, value: ml, effect: NoSchedule}" in found["fix"]
    finally:
        for node in ("node01", "node02"):
            client.patch(Node, node, {"spec": {"taints": None}}, field_manager="kubectl")
        client.delete(Pod, "untolerated", namespace="default", grace_period=0)
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_gpu_pod_sees_exactly_the_gpu_it_was_allocated(fleet: dict) -> None:
    output = run_pod(fleet, "one-gpu", "--node-selector", "accelerator=nvidia-a100", "--", "nvidia-smi", "-L")
    assert "pod default/one-gpu on node01: Succeeded" in output, output
    listed = [line for line in output.splitlines() if line.startswith("GPU ")]
    assert len(listed) == 1
    uuid = listed[0].split("UUID: ")[1].rstrip(")")
    assert uuid in ssh(fleet, "node01", "nvidia-smi -L")
    two = run_pod(fleet, "two-v100", "--gpus", "2", "--node-selector", "accelerator=nvidia-v100", "--", "cuda-probe")
    assert "on node02: Succeeded" in two and "CUDA devices: 2" in two, two


def test_a_pod_asking_for_more_gpus_than_exist_stays_pending(fleet: dict) -> None:
    output = run_pod(fleet, "too-big", "--gpus", "8", "--timeout", "3")
    assert "FailedScheduling: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in output, output
    code, report = doctor(fleet, "--pod", "default/too-big")
    assert code == 1
    found = problem(report, "pod default/too-big")
    assert found["code"] == "insufficient-gpus" and "node01: 4 allocatable" in " ".join(found["evidence"])


def test_who_holds_the_gpus_is_named(fleet: dict) -> None:
    holder = run_pod(fleet, "holder", "--gpus", "4", "--timeout", "0", "--", "sleep", "60")
    assert "pod default/holder on " in holder, holder
    wait_for(lambda: api(fleet).get(Pod, "holder", namespace="default").status.phase == "Running", 90)
    assert api(fleet).get(Pod, "holder", namespace="default").spec.nodeName == "node01"
    output = run_pod(fleet, "waiter", "--gpus", "1", "--node-selector", "accelerator=nvidia-a100", "--timeout", "3")
    assert "1 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector." in output, output
    found = problem(doctor(fleet, "--pod", "default/waiter")[1], "pod default/waiter")
    assert "node01: 4 allocatable, held by default/holder (4)" in found["evidence"], found
    api(fleet).delete(Pod, "holder", namespace="default")


def test_a_node_selector_that_matches_no_gpu_node(fleet: dict) -> None:
    run_pod(fleet, "lost", "--node-selector", "accelerator=nvidia-h100", "--timeout", "2")
    found = problem(doctor(fleet, "--pod", "default/lost")[1], "pod default/lost")
    assert found["code"] == "selector-no-gpu-node"
    assert "accelerator=nvidia-a100" in " ".join(found["evidence"])


@pytest.mark.parametrize(("limits", "requests"), [
    (None, {"nvidia.com/gpu": 1}),
    ({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 2}),
    ({"nvidia.com/gpu": "0.5"}, None),
    ({"nvidia.com/gpu": -1}, None),
    ({"nvidia.com/gpu": "1.5"}, {"nvidia.com/gpu": "1.5"}),
    ({"nvidia.com/gpu": "1.0"}, None),  # accepted: quantities compare as quantities
    ({"nvidia.com/gpu": "1000m"}, {"nvidia.com/gpu": 1}),
])
def test_lint_says_exactly_what_the_api_server_says(fleet: dict, limits: dict | None, requests: dict | None) -> None:
    """gpunode lint's words against the real 1.37 API server's, for the same pod."""
    from gpunode.lint import resource_errors

    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    spec = {"containers": [{"name": "c", "image": "i", "resources": resources}]}
    expected = [str(e) for e in resource_errors(spec)]
    pod = Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "default"},
                         "spec": spec})
    if not expected:
        api(fleet).create(pod, dry_run=True)  # the API server accepts it too
        return
    with pytest.raises(ApiError) as caught:
        api(fleet).create(pod, dry_run=True)
    words = expected[0] if len(expected) == 1 else f"[{', '.join(expected)}]"
    assert caught.value.status.code == 422
    assert caught.value.status.message == f'Pod "bad" is invalid: {words}'


DRA_POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "image": "i", "resources": {"claims": [{"name": "gpus"}]}}]}}
DRA_TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "bad", "namespace": "default"},
                "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": "gpu.gpunode.io", "count": -1}}]}}}}


@pytest.mark.parametrize("document", [
    DRA_POD,  # a container's claim the pod does not list (its list empty)
    {**DRA_POD, "spec": {**DRA_POD["spec"], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}},
    DRA_TEMPLATE,  # a request count below one
])
def test_lint_says_what_the_api_server_says_of_dra_references(fleet: dict, document: dict) -> None:
    """gpunode lint's DRA errors against the real 1.37 API server's (resource.k8s.io/v1), for the same object."""
    import yaml
    from lightkube.resources.resource_v1 import ResourceClaimTemplate

    from gpunode.lint import lint_text

    errors = [f.what for f in lint_text(yaml.safe_dump(document), "m.yaml") if f.level == "error"]
    kind = Pod if document["kind"] == "Pod" else ResourceClaimTemplate
    with pytest.raises(ApiError) as caught:
        api(fleet).create(kind.from_dict(document), dry_run=True)
    group = "" if kind is Pod else ".resource.k8s.io"
    assert caught.value.status.code == 422
    assert caught.value.status.message == f'{document["kind"]}{group} "bad" is invalid: {errors[0]}', errors


def test_a_workload_whose_pods_a_quota_refuses_is_diagnosed_before_any_pod_exists(fleet: dict) -> None:
    """Before: 'pods "trainer" not found', fix 'kubectl get pods -A'; the quota and FailedCreate never read."""
    client = api(fleet)
    client.create(Namespace.from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "quota-ns"}}))
    try:
        client.create(ResourceQuota.from_dict({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {
            "name": "gpu-quota", "namespace": "quota-ns"}, "spec": {"hard": {"requests.nvidia.com/gpu": "0"}}}))
        wait_for(lambda: (client.get(ResourceQuota, "gpu-quota", namespace="quota-ns").status.hard or {}), 30)
        client.create(Deployment.from_dict({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {
            "name": "trainer", "namespace": "quota-ns"}, "spec": {
            "replicas": 1, "selector": {"matchLabels": {"app": "trainer"}}, "template": {
                "metadata": {"labels": {"app": "trainer"}}, "spec": {
                    "runtimeClassName": "nvidia", "terminationGracePeriodSeconds": 0, "containers": [{
                        "name": "main", "image": "gpunode-workload:1", "command": ["sleep", "3600"],
                        "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}))
        wait_for(lambda: any(e.reason == "FailedCreate" for e in client.list(Event, namespace="quota-ns")), 60)
        for reference in ("quota-ns/trainer", "quota-ns/deployment/trainer"):
            found = problem(doctor(fleet, "--pod", reference)[1], f"pod {reference}")
            assert found["code"] == "quota-exceeded", found
            evidence = " | ".join(found["evidence"])
            assert "is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=1" in evidence
            assert "resourcequota gpu-quota: requests.nvidia.com/gpu used 0 of 0" in evidence
        client.patch(ResourceQuota, "gpu-quota", {"spec": {"hard": {"requests.nvidia.com/gpu": "1"}}},
                     namespace="quota-ns")
        wait_for(lambda: list(client.list(Pod, namespace="quota-ns")), 90)
        report = doctor(fleet, "--pod", "quota-ns/trainer")[1]
        links = report["links"]["pod quota-ns/trainer"]
        first = links[0]["evidence"][0]
        assert first.startswith("deployment quota-ns/trainer: diagnosing its pod quota-ns/trainer-"), links
        missing = gpunode("doctor", INVENTORY, "--pod", "quota-ns/nothing", env=fleet["env"], check=False)
        assert 'no pod or workload named "nothing" in namespace quota-ns' in missing.stdout + missing.stderr
    finally:
        client.delete(Namespace, "quota-ns")
        wait_for(lambda: not list(client.list(Pod, namespace="quota-ns")), 90)  # its GPU free for the next tests


def test_a_pod_without_runtime_class_gets_no_gpu_and_doctor_says_why(fleet: dict) -> None:
    output = run_pod(fleet, "plain", "--runtime-class", "")
    assert "CUDA_ERROR_NO_DEVICE" in output, output
    found = problem(doctor(fleet, "--pod", "default/plain")[1], "pod default/plain")
    assert found["code"] == "no-runtime-class" and "runtimeClassName: nvidia" in found["fix"]


# -- node faults: (inject, doctor's subject and what it must say, the verify (host, step) that fails) -------------

def sim_fault(name: str) -> Callable[[dict], None]:
    return lambda fleet: gpunode("sim", "fault", "node01", name, env=fleet["env"])


def clear_fault(fleet: dict) -> None:
    gpunode("sim", "fault", "node01", "--clear", env=fleet["env"])


def live_fault(name: str) -> Callable[[dict], None]:
    """A fault a running driver acquires: no reboot to inject it, none to clear it."""
    return lambda fleet: gpunode("sim", "fault", "node01", name, "--live", env=fleet["env"])


def clear_live_fault(fleet: dict) -> None:
    gpunode("sim", "fault", "node01", "--clear", "--live", env=fleet["env"])


# a config.toml as Ubuntu's packages wrote it, on a Debian node; and one naming an ldconfig no host has (a custom
# glibc's, removed since): both set with NVIDIA's own tool
SET_LDCONFIG = ("nvidia-ctk config --in-place --config-file=/etc/nvidia-container-runtime/config.toml "
                "--set nvidia-container-cli.ldconfig=")
UBUNTU_LDCONFIG = SET_LDCONFIG + "@/sbin/ldconfig.real"
MISSING_LDCONFIG = SET_LDCONFIG + "@/opt/glibc/sbin/ldconfig"

NODE_FAULTS = {
    "driver-not-loaded": (sim_fault("driver-not-loaded"), "node01", "driver", "kernel module is not loaded",
                          clear_fault),
    "library-mismatch": (sim_fault("library-mismatch"), "node01", "driver", "driver upgraded without reboot",
                         clear_fault),
    "nouveau": (sim_fault("nouveau"), "node01", "driver", "nouveau", clear_fault),
    "xid-79": (sim_fault("fallen-off-bus"), "node01", "driver", "fallen off the bus (Xid 79)", clear_fault),
    # before: driver "ok" with /dev/nvidia-uvm absent from its own evidence
    "uvm-missing": (sim_fault("uvm-missing"), "node01", "driver", "nvidia_uvm is not loaded", clear_fault),
    # before: not injectable (no ECC, retired-pages or remapped-rows data in the nvidia-smi stand-in)
    "ecc-uncorrectable": (live_fault("ecc-uncorrectable"), "node01", "driver",
                          "uncorrectable memory errors, repair pending until a GPU reset", clear_live_fault),
    "compute-prohibited": (live_fault("compute-prohibited"), "node01", "driver", "compute mode Prohibited",
                           clear_live_fault),
    # before: device plugin "not checked" and "nothing is broken"
    "mig-no-instances": (sim_fault("mig-no-instances"), "node01", "driver",
                         "MIG mode is on but no MIG device exists on GPU(s) 0", clear_fault),
    # MIG devices whose capability nodes are missing: no container can be given one
    "mig-caps-missing": (sim_fault("mig-caps-missing"), "node01", "driver",
                         "2 MIG device(s) exist but /dev/nvidia-caps has no capability device node", clear_fault),
    # before: not injectable (no reset_status in the nvidia-smi stand-in) and never read
    "reset-required": (live_fault("reset-required"), "node01", "driver", "requires a reset", clear_live_fault),
    "toolkit-removed": (
        lambda fleet: ssh(fleet, "node01", "apt-mark unhold nvidia-container-toolkit nvidia-container-toolkit-base "
                                           ">/dev/null; apt-get remove -y -q nvidia-container-toolkit "
                                           "nvidia-container-toolkit-base >/dev/null 2>&1"),
        "node01", "toolkit", "toolkit", None),
    # before: "nothing is broken" (config.toml never read) while every GPU container failed at its creation
    "toolkit-ldconfig-missing": (
        lambda fleet: ssh(fleet, "node01", MISSING_LDCONFIG), "node01", "toolkit",
        "ldconfig /opt/glibc/sbin/ldconfig does not exist on this host", None),
    # before: node chain and verify passed; the deploy did not repair it
    "toolkit-runtime-not-executable": (
        lambda fleet: ssh(fleet, "node01", "chmod 0644 /usr/bin/nvidia-container-runtime"), "node01", "toolkit",
        "not executable: /usr/bin/nvidia-container-runtime", None),
    "runtime-not-configured": (
        lambda fleet: ssh(fleet, "node01", f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml; "
                                           "rm -f /etc/containerd/conf.d/99-nvidia.toml; systemctl restart containerd"),
        "node01", "runtime", "no nvidia runtime", None),
}


@pytest.mark.parametrize("fault", list(NODE_FAULTS))
def test_doctor_names_each_node_fault_and_verify_fails_that_step(fleet: dict, tmp_path: Path, fault: str) -> None:
    inject, subject, link, said, repair = NODE_FAULTS[fault]
    inject(fleet)
    try:
        code, report = doctor(fleet)
        assert code == 1
        found = problem(report, subject)
        assert (found["link"], said in found["what"]) == (link, True), found
        assert found["fix"]
        assert [p["subject"] for p in report["problems"]] == [subject], report  # nothing else is blamed
        assert (subject, link) in failing(verify(fleet, tmp_path)[1])
    finally:
        if repair:
            repair(fleet)
        assert deploy(fleet, tmp_path)[0].returncode == 0
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_persistence_mode_off_is_a_warning_that_breaks_nothing(fleet: dict, tmp_path: Path) -> None:
    """A warning: doctor and verify still pass, doctor's driver link says it with nvidia-smi's words and the fix."""
    live_fault("persistence-off")(fleet)
    try:
        code, report = doctor(fleet)
        assert code == 0, report
        driver = next(link for link in report["links"]["node01"] if link["link"] == "driver")
        assert driver["state"] == "ok"
        assert any(line.startswith("warning: persistence mode is off on GPU(s) 1") and
                   "nvidia-smi persistence_mode: GPU 1 Disabled" in line for line in driver["evidence"]), driver
        result, results = verify(fleet, tmp_path)
        assert result.returncode == 0 and "warning node01 driver: persistence mode is off on GPU(s) 1" in result.stdout
        assert [f["code"] for f in results["hosts"]["node01"]["driver"]["findings"]] == ["persistence-mode-off"]
    finally:
        clear_live_fault(fleet)


CHECKER = "gpunode-node-checker"


def checker_conditions(fleet: dict, node: str) -> dict[str, tuple[str, str, str]]:
    from gpunode.verify.node_conditions import CONDITIONS

    found = {c.type: (c.status, c.reason or "", c.message or "")
             for c in api(fleet).get(Node, node).status.conditions or []}
    return {kind: found[kind] for kind in CONDITIONS.values() if kind in found}


def wait_for_condition(fleet: dict, node: str, kind: str, status: str, timeout: float) -> tuple[str, str, str]:
    deadline = time.monotonic() + timeout
    while True:
        found = checker_conditions(fleet, node).get(kind)
        if found and found[0] == status:
            return found
        if time.monotonic() > deadline:
            pods = [(p.metadata.name, p.spec.nodeName, p.status.phase, [
                (c.state.waiting.reason if c.state and c.state.waiting else "", c.restartCount)
                for c in p.status.containerStatuses or []])
                for p in api(fleet).list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": CHECKER})]
            raise AssertionError(f"{kind} of {node} is {found}, not {status}, after {timeout:.0f} s; pods: {pods}")
        time.sleep(1)


def checker_pod(fleet: dict, node: str) -> Pod:
    pods = [p for p in api(fleet).list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": CHECKER})
            if p.spec.nodeName == node and not p.metadata.deletionTimestamp]
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def kubeconfig_of(fleet: dict, tmp_path: Path, pod: Pod) -> Path:
    """A kubeconfig with the node checker's token bound to ``pod``, as its kubelet gets one."""
    from lightkube.models.authentication_v1 import BoundObjectReference, TokenRequestSpec
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import ServiceAccount

    token = api(fleet).create(ServiceAccount.Token(metadata=ObjectMeta(), spec=TokenRequestSpec(
        audiences=[], expirationSeconds=3600,
        boundObjectRef=BoundObjectReference(kind="Pod", apiVersion="v1", name=pod.metadata.name,
                                            uid=pod.metadata.uid))),
        CHECKER, namespace=NAMESPACE).status.token
    admin = yaml.safe_load((Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig").read_text())
    cluster = admin["clusters"][0]
    path = tmp_path / "checker.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "checker", "clusters": [cluster],
        "users": [{"name": "checker", "user": {"token": token}}],
        "contexts": [{"name": "checker", "context": {"cluster": cluster["name"], "user": "checker"}}]}))
    return path


def test_the_node_checker_publishes_each_link_as_a_node_condition_and_verify_in_cluster_reads_it(
        fleet: dict, tmp_path: Path) -> None:
    """The deploy runs the node checker on every GPU node (its own image from the fleet's registry, its own
    least-privilege identity, the host's root read-only through chroot): each GPU node carries the chain's
    conditions, all True; verify --in-cluster says what verify over SSH says; a runtime fault on node01 turns
    NvidiaRuntimeReady False with the diagnosis' reason within an interval, with an Event, and doctor
    --in-cluster names it with doctor's fix; the checker's token may not write another node's status."""
    interval = 20  # the simulated fleet's checker_interval
    with_checker = {**fleet["env"], "GPUNODE_SIM_CHECKER": "on"}  # the inventory then names the checker's image
    report = tmp_path / "checker-deploy.json"
    deployed = gpunode("deploy", INVENTORY, "device_plugin", "--report", str(report), env=with_checker, check=False)
    try:
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-2000:]
        checked_on_the_cluster(fleet, tmp_path, interval)
    finally:
        client = api(fleet)  # the other tests run without it: its objects and records go
        for kind, name in ((DaemonSet, CHECKER), (ConfigMap, "gpunode-node-settings"), (ServiceAccount, CHECKER)):
            try:
                client.delete(kind, name, namespace=NAMESPACE)
            except ApiError as error:
                if error.status.code != 404:
                    raise
        for record in client.list(ConfigMap, namespace=NAMESPACE, labels={"gpunode.io/node-record": exists()}):
            client.delete(ConfigMap, record.metadata.name, namespace=NAMESPACE)
        wait_for(lambda: not list(client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": CHECKER})),
                 90)


def checked_on_the_cluster(fleet: dict, tmp_path: Path, interval: int) -> None:
    """The checker's DaemonSet at work on the session fleet (see the test above)."""
    for node in ("node01", "node02"):
        for kind in CONDITIONS.values():
            wait_for_condition(fleet, node, kind, "True", 3 * interval + 60)
        assert {kind: reason for kind, (_, reason, _) in checker_conditions(fleet, node).items()} == \
            dict.fromkeys(CONDITIONS.values(), "Verified")
    assert "GPUDriverReady" not in checker_conditions(fleet, "node03")  # a CPU node runs no checker
    pod = checker_pod(fleet, "node01")
    container = pod.spec.containers[0]
    assert container.securityContext.capabilities.add == ["SYS_CHROOT"]
    assert container.securityContext.capabilities.drop == ["ALL"] and not container.securityContext.privileged
    assert all(m.readOnly for m in container.volumeMounts if m.mountPath == "/host")

    ssh_result, ssh_results = verify(fleet, tmp_path)
    out = tmp_path / "in-cluster.json"
    in_cluster = gpunode("verify", INVENTORY, "--in-cluster", "--json", str(out), env=fleet["env"], check=False)
    assert in_cluster.returncode == ssh_result.returncode == 0, in_cluster.stdout + in_cluster.stderr
    results = json.loads(out.read_text())
    states = {host: {s: r["state"] for s, r in steps.items()} for host, steps in results["hosts"].items()}
    assert states == {host: {s: r["state"] for s, r in steps.items()} for host, steps in ssh_results["hosts"].items()}
    assert states["node01"] == states["node02"] == dict.fromkeys(results["steps"], "ok")
    assert states["node03"]["labels"] == "ok" and states["node03"]["driver"] == "not checked"  # a CPU node
    assert results["hosts"]["node01"]["runtime"]["proof"] == ssh_results["hosts"]["node01"]["runtime"]["proof"]

    # what it costs its node: the process's memory and CPU so far, as the node's /proc reads them
    usage = {node: checker_usage(fleet, node) for node in ("node01", "node02")}
    for node, (rss_kib, alive, cpu) in usage.items():
        print(f"checker on {node}: RSS {rss_kib / 1024:.0f} MiB, {cpu:.2f} CPU s in its first {alive:.0f} s")
        assert rss_kib < 256 * 1024  # its memory limit

    # its API cost, from the API server's audit log: its status when a condition changed or a heartbeat is due,
    # the record and Events only when the verdict changed, a read of its Node and record when it starts
    first = {node: checker_requests(fleet, node) for node in ("node01", "node02")}
    for node, kinds in first.items():
        patches = kinds.pop("patch nodes/status")
        print(f"checker API requests on {node}, in its first {usage[node][1]:.0f} s: {dict(kinds)}, "
              f"{patches} status write(s)")
        writes = sum(count for kind, count in kinds.items() if not kind.startswith(("get ", "list ")))
        assert patches >= 1 and kinds.pop("refused", 0) == 0, kinds
        assert patches <= usage[node][1] / CHECKER_HEARTBEAT + 2, patches  # its first, then one per heartbeat
        assert kinds["patch configmaps/"] + kinds["create configmaps/"] <= 3, kinds  # not one per interval
        assert writes <= 12, kinds  # its record and an Event per condition, when they change
        # its reads: its Node once per check (and once when it starts), not one per node of the fleet
        assert kinds["get nodes/"] <= usage[node][1] / interval + 3, kinds

    # its own node only: with the token of node01's checker pod, the policy refuses node02's status
    kubeconfig = kubeconfig_of(fleet, tmp_path, pod)
    denied = gpunode("node-check", "--inventory", INVENTORY, "--node", "node02", "--once", "--data",
                     f"kubeconfig={kubeconfig}", "--data", "kube_context=", env=fleet["env"], check=False)
    assert denied.returncode == 1
    assert "the node checker of node node01 may not write the status of node node02" in denied.stderr, denied.stderr

    NODE_FAULTS["runtime-not-configured"][0](fleet)
    try:
        _, ssh_report = doctor(fleet, "--limit", "node01")
        expected = problem(ssh_report, "node01")
        status, reason, message = wait_for_condition(fleet, "node01", "NvidiaRuntimeReady", "False", 2 * interval + 15)
        assert reason == camel(expected["code"]) and "no nvidia runtime" in message, (reason, message)
        def checker_events() -> list[Event]:
            return [e for e in api(fleet).list(Event, namespace="default", fields={"involvedObject.name": "node01"})
                    if e.source and e.source.component == CHECKER]

        def warned() -> bool:  # the checker creates the Event just after it patches the condition the wait saw
            return any(e.reason == reason and e.type == "Warning" for e in checker_events())

        deadline = time.monotonic() + 30
        while not warned() and time.monotonic() < deadline:
            time.sleep(1)
        events = checker_events()
        assert any(e.reason == reason and e.type == "Warning" and expected["fix"] in e.message for e in events), \
            [(e.reason, e.message) for e in events]
        code, report = doctor(fleet, "--in-cluster", "--limit", "node01")
        found = problem(report, "node01")
        assert code == 1 and (found["link"], found["code"], found["fix"]) == \
            (expected["link"], expected["code"], expected["fix"]), (found, expected)
    finally:
        assert deploy(fleet, tmp_path, "runtime", "--limit", "node01")[0].returncode == 0
    wait_for_condition(fleet, "node01", "NvidiaRuntimeReady", "True", 2 * interval + 15)

    # its steady cost, once the repair is seen: CPU and API requests per check over two intervals of nothing new:
    # no write but at most one heartbeat (every three intervals here), which keeps its conditions fresh
    before = {node: (checker_usage(fleet, node), checker_requests(fleet, node)) for node in ("node01", "node02")}
    time.sleep(2 * interval + 2)
    for node, ((_, since, cpu_since), requests_since) in before.items():
        rss_kib, alive, cpu = checker_usage(fleet, node)
        kinds = checker_requests(fleet, node) - requests_since
        checks, writes = kinds["get nodes/"], kinds["patch nodes/status"]
        reads = sum(count for kind, count in kinds.items() if kind.startswith(("get ", "list ")))
        print(f"checker on {node}, steady: {checks} checks in {alive - since:.0f} s, {writes} status write(s), "
              f"{(cpu - cpu_since) / max(checks, 1):.2f} CPU s and {reads / max(checks, 1):.1f} reads per check, "
              f"RSS {rss_kib / 1024:.0f} MiB; requests: {dict(kinds)}")
        assert checks >= 2 and kinds["refused"] == 0, kinds
        assert reads <= 4 * checks, kinds  # its Node, the plugin's DaemonSet, two pod lists bound to its node
        assert writes <= 1 and sum(kinds.values()) == reads + writes, kinds  # no record, no Event: nothing changed
        beats = [c.lastHeartbeatTime for c in api(fleet).get(Node, node).status.conditions or []
                 if c.type in CONDITIONS.values()]
        age = max((datetime.now(UTC) - beat).total_seconds() for beat in beats)
        assert len(beats) == len(CONDITIONS) and age <= CHECKER_HEARTBEAT + interval + 15, (node, age)
        assert rss_kib < 256 * 1024


def checker_requests(fleet: dict, node: str) -> Counter:
    """The API requests of the node checker on ``node`` so far, by verb and resource, from the API server's audit
    log ("refused": answered 300 or more, but for its record's 404 before its first write)."""
    audit = Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "run" / "kube-apiserver-audit.log"
    kinds: Counter = Counter()
    for entry in map(json.loads, audit.read_text().splitlines()):
        if entry["stage"] != "ResponseComplete" or \
                entry["user"]["username"] != f"system:serviceaccount:{NAMESPACE}:{CHECKER}" or \
                entry["user"].get("extra", {}).get("authentication.kubernetes.io/node-name") != [node]:
            continue
        ref, code = entry["objectRef"], entry["responseStatus"]["code"]
        kinds[f"{entry['verb']} {ref['resource']}/{ref.get('subresource', '')}"] += 1
        if code >= 300 and (entry["verb"], ref["resource"], code) != ("get", "configmaps", 404):
            kinds["refused"] += 1
    return kinds


def checker_usage(fleet: dict, node: str) -> tuple[int, float, float]:
    """(RSS KiB, seconds alive, CPU seconds) of the node checker's process on ``node``, from the node's /proc; its
    CPU with the commands it ran and waited for (the facts command's nvidia-smi, containerd, dpkg...)."""
    out = ssh(fleet, node, "pid=$(pgrep -f 'node-chec[k] --root' | head -1); cat /proc/$pid/stat; "
                           "grep VmRSS /proc/$pid/status; cat /proc/uptime; getconf CLK_TCK").splitlines()
    fields = out[0].rsplit(") ", 1)[1].split()
    tick = int(out[3])
    cpu, started = sum(int(field) for field in fields[11:15]), int(fields[19])  # utime, stime, cutime, cstime
    return int(out[1].split()[1]), float(out[2].split()[0]) - started / tick, cpu / tick


def test_a_toolkit_config_naming_a_missing_ldconfig_fails_gpu_containers_with_the_clis_words(fleet: dict,
                                                                                            tmp_path: Path) -> None:
    """Before: the pod failed, doctor --pod said "container exited", doctor said nothing is broken.

    And Ubuntu's "@/sbin/ldconfig.real" on this Debian node is no fault at all: NVIDIA's own hook (since 1.15)
    runs /sbin/ldconfig where the .real one is missing. Our runtime stand-in failed every GPU container on it, and
    doctor agreed with the stand-in (both ours); NVIDIA's hook on the node showed them both wrong."""
    ssh(fleet, "node01", UBUNTU_LDCONFIG)
    try:
        output = run_pod(fleet, "ldcache-ubuntu", "--node-selector", "accelerator=nvidia-a100", "--", "nvidia-smi",
                         "-L")
        assert "on node01: Succeeded" in output and "GPU 0: NVIDIA A100" in output, output
        assert not [p for p in doctor(fleet)[1]["problems"] if p["subject"] == "node01"]
    finally:
        api(fleet).delete(Pod, "ldcache-ubuntu", namespace="default", grace_period=0)
    ssh(fleet, "node01", MISSING_LDCONFIG)
    try:
        output = run_pod(fleet, "ldcache", "--node-selector", "accelerator=nvidia-a100", "--timeout", "30")
        assert "nvidia-container-cli: ldcache error: open failed: /opt/glibc/sbin/ldconfig: no such file or " \
               "directory" in output, output
        assert "error running hook #0" in output, output  # runc's own words for the failed hook
        found = problem(doctor(fleet, "--pod", "default/ldcache")[1], "pod default/ldcache")
        assert found["code"] == "hook-ldconfig-failed" and "deploys/toolkit.py" in found["fix"], found
        assert "OCI runtime create failed" in " ".join(found["evidence"]), found
    finally:
        result = deploy(fleet, tmp_path)[0]
        assert result.returncode == 0, result.stdout[-3000:]
        api(fleet).delete(Pod, "ldcache", namespace="default", grace_period=0)
    fixed = run_pod(fleet, "ldcache-fixed", "--node-selector", "accelerator=nvidia-a100", "--", "nvidia-smi", "-L")
    assert "on node01: Succeeded" in fixed and "GPU 0: NVIDIA A100" in fixed, fixed
    api(fleet).delete(Pod, "ldcache-fixed", namespace="default", grace_period=0)


TOOLKIT_MODE = ("nvidia-ctk config --in-place --config-file=/etc/nvidia-container-runtime/config.toml "
                "--set nvidia-container-runtime.mode={mode}")


def test_a_cdi_spec_is_written_by_nvidia_ctk_and_judged_against_the_gpus(fleet: dict, tmp_path: Path) -> None:
    """The runtime in cdi mode needs a spec of this node's GPUs: missing, then stale (a GPU swapped since it was
    written), each named by doctor and failing verify's toolkit step; the deploy writes it with NVIDIA's own
    generator over the simulated libnvidia-ml.so.1."""
    before = ssh(fleet, "node01", "cat /etc/nvidia-container-runtime/config.toml")
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in
             ssh(fleet, "node01", "nvidia-smi -L").splitlines() if "UUID: " in line]
    assert len(uuids) == 4, uuids
    ssh(fleet, "node01", TOOLKIT_MODE.format(mode="cdi") + "; rm -f /etc/cdi/nvidia.yaml")
    try:
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("toolkit", "toolkit-cdi-spec-missing"), found
        assert ("node01", "toolkit") in failing(verify(fleet, tmp_path)[1])
        result = deploy(fleet, tmp_path, "toolkit", "--limit", "node01")[0]
        assert result.returncode == 0, result.stdout[-3000:]
        spec = ssh(fleet, "node01", "cat /etc/cdi/nvidia.yaml")
        assert "kind: nvidia.com/gpu" in spec and all(f"name: {uuid}" in spec for uuid in uuids), spec
        assert spec.startswith("---\ncdiVersion: "), spec  # as nvidia-ctk writes it
        code, report = doctor(fleet)
        assert code == 0, report["problems"]
        # GPU 2 replaced since the spec was written: the spec names a GPU this node no longer has
        gone = "GPU-00000000-0000-4000-8000-000000000002"
        ssh(fleet, "node01", f"sed -i 's/{uuids[2]}/{gone}/' /etc/cdi/nvidia.yaml")
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("toolkit", "toolkit-cdi-spec-stale"), found
        assert gone in found["what"] and "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in found["fix"]
        assert deploy(fleet, tmp_path, "toolkit", "--limit", "node01")[0].returncode == 0
        assert uuids[2] in ssh(fleet, "node01", "cat /etc/cdi/nvidia.yaml")
        assert doctor(fleet)[0] == 0
    finally:
        ssh(fleet, "node01", "rm -f /etc/cdi/nvidia.yaml; cat > /etc/nvidia-container-runtime/config.toml <<'EOF'\n"
                             f"{before}EOF")
    assert ssh(fleet, "node01", "cat /etc/nvidia-container-runtime/config.toml") == before


def test_a_device_node_closed_to_other_users_fails_non_root_gpu_containers(fleet: dict, tmp_path: Path) -> None:
    """Before: driver "ok" (modes not read); the pod failed with NVML's words and doctor --pod said "exited 255"."""
    sim_fault("nvidiactl-0600")(fleet)
    try:
        found = problem(doctor(fleet)[1], "node01")
        assert (found["link"], found["code"]) == ("driver", "device-mode"), found
        assert "stat -c %a /dev/nvidiactl: 600" in found["evidence"] and "chmod 0666 /dev/nvidiactl" in found["fix"]
        assert ("node01", "driver") in failing(verify(fleet, tmp_path)[1])
        output = run_pod(fleet, "nonroot", "--run-as-user", "1000", "--node-selector", "accelerator=nvidia-a100",
                         "--", "nvidia-smi", "-L")
        assert "Failed to initialize NVML: Insufficient Permissions" in output, output
        pod = problem(doctor(fleet, "--pod", "default/nonroot")[1], "pod default/nonroot")
        assert pod["code"] == "device-permissions" and "node01" in pod["fix"], pod
        root = run_pod(fleet, "asroot", "--node-selector", "accelerator=nvidia-a100", "--", "nvidia-smi", "-L")
        assert "on node01: Succeeded" in root, root  # root still opens it: the fault is the mode, not the device
    finally:
        clear_fault(fleet)
        for name in ("nonroot", "asroot"):
            api(fleet).delete(Pod, name, namespace="default", grace_period=0)
    wait_for(lambda: doctor(fleet)[0] == 0, 90)


def test_an_image_that_needs_a_newer_cuda_than_the_driver_is_named(fleet: dict) -> None:
    """Before: the runtime stand-in ignored NVIDIA_REQUIRE_CUDA and the pod succeeded; doctor had no words for it."""
    output = run_pod(fleet, "needs-cuda13", "--env", "NVIDIA_REQUIRE_CUDA=cuda>=13.0", "--node-selector",
                     "accelerator=nvidia-a100", "--timeout", "30", "--", "nvidia-smi", "-L")
    try:
        assert "requirement error: unsatisfied condition: cuda>=13.0, please update your driver" in output, output
        found = problem(doctor(fleet, "--pod", "default/needs-cuda13")[1], "pod default/needs-cuda13")
        assert found["code"] == "driver-too-old-for-image" and "node01" in found["fix"], found
    finally:
        api(fleet).delete(Pod, "needs-cuda13", namespace="default", grace_period=0)


def test_missing_nvidia_runtime_fails_the_pod_with_cris_words(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node01", f"{CONTAINERD_DEFAULT} > /etc/containerd/config.toml; "
                         "rm -f /etc/containerd/conf.d/99-nvidia.toml; systemctl restart containerd")
    try:
        output = run_pod(fleet, "no-handler", "--node-selector", "accelerator=nvidia-a100", "--timeout", "5")
        assert 'no runtime for "nvidia" is configured' in output, output
        found = problem(doctor(fleet, "--pod", "default/no-handler")[1], "pod default/no-handler")
        assert found["code"] == "runtime-handler-missing" and "deploys/runtime.py" in found["fix"]
    finally:
        assert deploy(fleet, tmp_path)[0].returncode == 0


def test_a_deleted_runtime_class(fleet: dict, tmp_path: Path) -> None:
    api(fleet).delete(RuntimeClass, "nvidia")
    try:
        output = run_pod(fleet, "rejected")
        assert 'pods "rejected" is forbidden: pod rejected: RuntimeClass "nvidia" not found' in output, output
        found = problem(doctor(fleet)[1], "cluster")
        assert found["code"] == "runtimeclass-missing"
    finally:
        assert deploy(fleet, tmp_path)[0].returncode == 0
    assert doctor(fleet)[0] == 0


def test_plugin_evicted_from_a_gpu_node(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.patch(Node, "node02", {"spec": {"taints": [{"key": "maintenance", "effect": "NoExecute"}]}},
                 field_manager="kubectl")
    try:
        wait_for(lambda: client.get(Node, "node02").status.allocatable.get("nvidia.com/gpu") == "0")
        found = problem(doctor(fleet)[1], "node02")
        assert (found["link"], found["code"]) == ("device_plugin", "plugin-not-scheduled")
        assert "node02 offers 0 allocatable nvidia.com/gpu, its driver sees 2" in found["what"]
    finally:
        client.patch(Node, "node02", {"spec": {"taints": None}}, field_manager="kubectl")
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_daemonset_without_gpu_node_selector_puts_a_plugin_pod_on_the_cpu_node(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    client.patch(DaemonSet, "gpunode-device-plugin", {"spec": {"template": {"spec": {"nodeSelector": None}}}},
                 namespace=NAMESPACE, field_manager="kubectl-edit")
    try:
        # node03's real kubelet asks its containerd for the pod's nvidia handler, which a CPU node does not have:
        # the sandbox is refused (on a node where it exists, the plugin would crash-loop on NVML instead)
        def refused() -> bool:
            return any(p["subject"] == "node03" and any("FailedCreatePodSandBox" in e for e in p["evidence"])
                       for p in doctor(fleet)[1]["problems"])
        wait_for(refused, 60)
        found = problem(doctor(fleet)[1], "node03")
        assert found["code"] == "plugin-on-cpu-node", found
        assert 'no runtime for "nvidia" is configured' in " ".join(found["evidence"]), found
        assert "cannot start" in found["what"] and "nodeSelector" in found["fix"]
    finally:
        assert deploy(fleet, tmp_path)[0].returncode == 0
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def test_a_plugin_without_the_socket_directory_mount_crash_loops(fleet: dict, tmp_path: Path) -> None:
    client = api(fleet)
    ds = client.get(DaemonSet, "gpunode-device-plugin", namespace=NAMESPACE).to_dict()
    containers = ds["spec"]["template"]["spec"]["containers"]
    for container in containers:
        container["volumeMounts"] = None  # strategic merge patch: null removes the list
    client.patch(DaemonSet, "gpunode-device-plugin", {"spec": {"template": {"spec": {"containers": containers}}}},
                 namespace=NAMESPACE, field_manager="kubectl-edit")
    try:
        # the DaemonSet rolls one node at a time (maxUnavailable 1); the first new pod crash-loops and stops the roll
        def broken_node() -> str | None:
            return next((n for n in ("node01", "node02") if any(
                p["subject"] == n and p["code"] == "plugin-crashloop" for p in doctor(fleet)[1]["problems"])), None)
        found_on: list[str] = []
        wait_for(lambda: bool(found_on.append(broken_node() or "") or found_on[-1]), 90)
        node = found_on[-1]
        # the kubelet posts the lost devices with its next node status (seconds later)
        wait_for(lambda: client.get(Node, node).status.allocatable.get("nvidia.com/gpu") == "0", 60)
        found = problem(doctor(fleet)[1], node)
        assert "socket directory" in " ".join(found["evidence"]) and "hostPath" in found["fix"], found
    finally:
        assert deploy(fleet, tmp_path)[0].returncode == 0
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def sliced(replicas: int) -> str:
    return json.dumps({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}})


def test_time_slicing_from_the_inventory_is_carried_and_expected(fleet: dict, tmp_path: Path) -> None:
    """Before: verify and doctor blamed Xids on a time-sliced node, and the deploy had no way to carry the config."""
    client = api(fleet)
    data = ("--data", f"plugin_config={sliced(2)}")
    try:
        result, _ = deploy(fleet, tmp_path, "device_plugin", *data)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        gpus = {n: client.get(Node, n).status.allocatable.get("nvidia.com/gpu") for n in ("node01", "node02")}
        assert gpus == {"node01": "8", "node02": "4"}  # the real kubelet (node01) and the agent (node02)
        assert verify(fleet, tmp_path, *data)[0].returncode == 0
        code, report = doctor(fleet, *data)
        evidence = " | ".join(next(link for link in report["links"]["node01"] if link["link"] == "device_plugin")[
            "evidence"])
        assert code == 0 and "4 GPU(s) x 2 replicas (plugin_config sharing.timeSlicing)" in evidence, report
        # before: not injectable, nothing read it: a GPU in Exclusive_Process takes one context, not two pods
        live_fault("compute-exclusive")(fleet)
        try:
            found = problem(doctor(fleet, *data)[1], "node01")
            assert (found["link"], found["code"]) == ("device_plugin", "exclusive-time-sliced"), found
            assert "nvidia-smi compute_mode: GPU 0 Exclusive_Process" in found["evidence"]
            assert ("node01", "device_plugin") in failing(verify(fleet, tmp_path, *data)[1])
        finally:
            clear_live_fault(fleet)
        wait_for(lambda: doctor(fleet, *data)[0] == 0, 60)
        found = problem(doctor(fleet)[1], "node01")  # an inventory without the config expects one per GPU
        assert found["code"] == "offers-more" and "node01 offers 8 allocatable nvidia.com/gpu" in found["what"]
        # someone edits the config in the cluster: the next deploy refuses to drop it, and says where it is
        config = client.get(ConfigMap, "gpunode-device-plugin-config", namespace=NAMESPACE)
        client.patch(ConfigMap, "gpunode-device-plugin-config", {"data": {"config.yaml": config.data[
            "config.yaml"].replace("replicas: 2", "replicas: 3")}}, namespace=NAMESPACE, field_manager="kubectl-edit")
        result, report = deploy(fleet, tmp_path, "device_plugin", *data)
        assert result.returncode == 1 and "configmap gpunode-device-plugin-config data config.yaml was edited " \
            "since gpunode applied it" in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
        assert "replicas: 3" in client.get(ConfigMap, "gpunode-device-plugin-config", namespace=NAMESPACE).data[
            "config.yaml"]
    finally:
        client.delete(ConfigMap, "gpunode-device-plugin-config", namespace=NAMESPACE)
        assert deploy(fleet, tmp_path, "device_plugin")[0].returncode == 0  # the inventory drops its own config
    assert {client.get(Node, n).status.allocatable.get("nvidia.com/gpu") for n in ("node01", "node02")} == {"4", "2"}
    wait_for(lambda: doctor(fleet)[0] == 0, 60)


def context_pod(name: str, seconds: int = 0) -> Pod:
    """A CUDA-style workload on node01's GPU 0 (named by the environment, as a user may; no device-plugin limit)."""
    return Pod.from_dict({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                          "spec": {"restartPolicy": "Never", "nodeName": "node01", "runtimeClassName": "nvidia",
                                   "containers": [{"name": "c", "image": "docker.io/library/gpunode-workload:1",
                                                   "imagePullPolicy": "Never",
                                                   "command": ["cuda-probe", str(seconds)],
                                                   "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "0"}]}]}})


def test_a_gpu_in_exclusive_compute_mode_takes_one_context_and_the_second_pod_is_told_why(fleet: dict) -> None:
    """Before: no stand-in enforced a compute mode: two CUDA pods on one Exclusive_Process GPU both ran. Now the
    second fails with CUDA's words, doctor --pod links them to the compute mode, and the first one's exit frees the
    GPU (the runtime frees a killed holder's context when its container is deleted)."""
    client = api(fleet)
    live_fault("compute-exclusive")(fleet)
    try:
        client.create(context_pod("ctx-holder", 90))
        held = "ls /run/gpunode-sim/contexts 2>/dev/null; true"  # the lock folder of each GPU a context holds
        wait_for(lambda: ssh(fleet, "node01", held).startswith("GPU-"), 90)
        client.create(context_pod("ctx-second"))
        wait_for(lambda: client.get(Pod, "ctx-second", namespace="default").status.phase in ("Succeeded", "Failed"),
                 90)
        assert client.get(Pod, "ctx-second", namespace="default").status.phase == "Failed"
        code, report = doctor(fleet, "--pod", "default/ctx-second")
        found = problem(report, "pod default/ctx-second")
        assert (code, found["code"]) == (1, "gpu-busy-or-unavailable"), found
        assert any("CUDA_ERROR_DEVICE_UNAVAILABLE: CUDA-capable device(s) is/are busy or unavailable" in line
                   for line in found["evidence"]), found
        assert "compute_mode" in found["fix"] and "node01" in found["fix"]
        client.delete(Pod, "ctx-holder", namespace="default", grace_period=0)  # killed: its context goes with it
        wait_for(lambda: not ssh(fleet, "node01", held).strip(), 60)
        client.create(context_pod("ctx-third"))
        wait_for(lambda: client.get(Pod, "ctx-third", namespace="default").status.phase in ("Succeeded", "Failed"),
                 90)
        assert client.get(Pod, "ctx-third", namespace="default").status.phase == "Succeeded"
    finally:
        clear_live_fault(fleet)
        for name in ("ctx-holder", "ctx-second", "ctx-third"):
            try:
                client.delete(Pod, name, namespace="default", grace_period=0)
            except ApiError as error:
                if error.status.code != 404:
                    raise


GARBAGE_SMI = ("printf '#!/bin/sh\\necho \"a, b, c, d, e, f, g, h\"\\necho \"\\\\001garbage\" >&2\\n'"
               " > /usr/local/bin/nvidia-smi && chmod +x /usr/local/bin/nvidia-smi")


def test_a_node_whose_nvidia_smi_prints_garbage_fails_alone(fleet: dict, tmp_path: Path) -> None:
    ssh(fleet, "node01", GARBAGE_SMI)  # first on PATH: the driver facts read junk rows
    try:
        result, report = deploy(fleet, tmp_path)
        output = result.stdout + result.stderr
        assert result.returncode == 1 and "Traceback" not in output, output[-3000:]
        assert report["node01"]["failed"], report
        assert not report["node02"]["failed"] and not report["node03"]["failed"], report
        code, found = doctor(fleet)
        assert code == 1 and problem(found, "node01")["link"] == "driver"
        assert [p["subject"] for p in found["problems"]] == ["node01"]
    finally:
        ssh(fleet, "node01", "rm -f /usr/local/bin/nvidia-smi")
    assert deploy(fleet, tmp_path)[0].returncode == 0


SCHEMA1 = ('[plugins.cri.containerd]\n  snapshotter = "overlayfs"\n  default_runtime_name = "runc"\n'
           '[plugins.cri.containerd.runtimes.runc]\n  runtime_type = "io.containerd.runc.v2"\n')


def test_a_versionless_schema_1_containerd_config_converges(fleet: dict, tmp_path: Path) -> None:
    """containerd 1.6 reads it (and warns on stderr); the real nvidia-ctk keeps version 1 and the cri plugin."""
    ssh(fleet, "node01", "cp /etc/containerd/config.toml /root/config.v2.toml && "
        f"printf '%s' '{SCHEMA1}' > /etc/containerd/config.toml && systemctl restart containerd")
    try:
        result, report = deploy(fleet, tmp_path, "runtime", "--limit", "node01")
        assert result.returncode == 0 and "Traceback" not in result.stdout + result.stderr, result.stdout[-3000:]
        assert "Configure the container runtime for the nvidia runtime" in " ".join(report["node01"]["changed"])
        written = ssh(fleet, "node01", "cat /etc/containerd/config.toml")
        assert written.startswith("version = 1\n") and "[plugins.cri.containerd.runtimes.nvidia]" in written
        assert "deprecated" in ssh(fleet, "node01", "containerd config dump 2>&1 >/dev/null")  # the warning
        assert verify(fleet, tmp_path)[0].returncode == 0
        assert doctor(fleet)[0] == 0
        assert deploy(fleet, tmp_path, "runtime", "--limit", "node01")[1]["node01"]["changed"] == []
    finally:
        ssh(fleet, "node01", "cp /root/config.v2.toml /etc/containerd/config.toml && systemctl restart containerd")
    assert deploy(fleet, tmp_path)[0].returncode == 0


def test_an_nvswitch_node_without_fabric_manager(tmp_path: Path, sim_env: dict[str, str]) -> None:
    """On a fleet of its own (one HGX H100 node): the fabric manager down is the driver step's failure."""
    env = {**sim_env, "GPUNODE_SIM_DIR": str(tmp_path / "sim"), "GPUNODE_SIM_NET": block(sim_env, 1)}
    try:  # a fleet that came up only in part is torn down too
        gpunode("sim", "up", "-n", "1", "--profile", "node01=h100x8-nvswitch", env=env)
        healthy = gpunode("doctor", INVENTORY, "--json", "--data", "cluster_steps=False", env=env, check=False)
        assert healthy.returncode == 1  # toolkit not installed yet: the first broken link after a healthy driver
        assert json.loads(healthy.stdout)["problems"][0]["link"] == "toolkit_repo"
        gpunode("sim", "fault", "node01", "fabricmanager-down", env=env)
        broken = gpunode("doctor", INVENTORY, "--json", "--data", "cluster_steps=False", env=env, check=False)
        found = json.loads(broken.stdout)["problems"][0]
        assert (found["subject"], found["link"]) == ("node01", "driver")
        assert "without a running nvidia-fabricmanager" in found["what"] and "nvidia-fabricmanager" in found["fix"]
    finally:
        gpunode("sim", "down", env=env, check=False)
