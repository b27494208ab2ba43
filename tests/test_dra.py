"""GPUs through Dynamic Resource Allocation on the simulated fleet: gpunode's DRA driver under the real kubelet
(1.35), scheduler and API server (1.37) on a containerd 1.7 node with CDI on.

One node (Debian 13, containerd 1.7.24, four A100s) deployed by gpunode with CDI on and the device plugin's
volume-mounts strategy (NVIDIA's runtime and hook take the GPUs from mounts); the device plugin's pods measured
first, then the deploy again with gpu_allocation = dra: the node drained, moved to the DRA driver's DaemonSet (the
plugin's image) and uncordoned once its ResourceSlice lists its GPUs. A pod with a claim template of 1 and of 2 GPUs
sees exactly its claim's GPUs; two pods share one claim; a restarted driver keeps what it prepared; an Xid takes a
GPU out of the slice; doctor follows what goes wrong.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from gpunode_plugin.dra_devices import DRIVER, GPU_CLASS, device_classes
from lightkube import ApiError, Client, codecs
from lightkube.config.kubeconfig import KubeConfig
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import Event, Node, Pod

from gpunode.cluster.labels import DRA_LABEL, PLUGIN_LABEL

from .conftest import block, gpunode
from .fleet_ssh import ssh_ok
from .test_provisioning import INVENTORY

pytestmark = pytest.mark.fleet

NAMESPACE = "gpunode-system"
NAME = "gpunode-dra-driver"
ResourceSlice = create_global_resource("resource.k8s.io", "v1", "ResourceSlice", "resourceslices")
ResourceClaim = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaim", "resourceclaims")
ResourceClaimTemplate = create_namespaced_resource("resource.k8s.io", "v1", "ResourceClaimTemplate",
                                                   "resourceclaimtemplates")
DeviceClass = create_global_resource("resource.k8s.io", "v1", "DeviceClass", "deviceclasses")


def wait_for(check: Callable[[], object], timeout: float, what: str, every: float = 1.0) -> object:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(every)


DEPLOY = ["--data", "cdi_enabled=True", "--data", "plugin_device_list_strategy=volume-mounts"]


@pytest.fixture(scope="module")
def dra(sim_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    folder = tmp_path_factory.mktemp("dra")
    fleet_file = folder / "fleet.yaml"
    fleet_file.write_text(json.dumps({"nodes": {"node01": "a100x4-containerd17"}}))
    env = {**sim_env, "GPUNODE_SIM_DIR": str(folder / "sim"), "GPUNODE_SIM_NET": block(sim_env, 2)}
    try:
        info = json.loads(gpunode("sim", "up", "--fleet", str(fleet_file), "--json", env=env, timeout=1800).stdout)
        info["env"] = env
        # the driver's CDI specs hand GPUs to NVIDIA's hook as volume mounts (as the plugin's volume-mounts strategy
        # does): gpu_allocation = dra needs that strategy and CDI, and the device plugin's path is measured with them
        deployed = gpunode("deploy", INVENTORY, *DEPLOY, env=env, check=False, timeout=900)
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-2000:]
        assert ssh_ok(info, "node01", "grep -x 'accept-nvidia-visible-devices-as-volume-mounts = true' "
                                      "/etc/nvidia-container-runtime/config.toml")
        client = api(info)
        # the device plugin's path first, for the latency to compare: a pod asking nvidia.com/gpu: 1, created to
        # running with its GPU listed
        info["device plugin"] = [time_to_gpus(client, codecs.from_dict(dp_pod(n))) for n in range(2)]
        # a GPU pod still running when the node moves to DRA: the switch drains it first
        client.create(codecs.from_dict(dp_pod(7)))
        wait_for(lambda: client.get(Pod, "dp-latency-7", namespace="default").status.phase == "Running", 120,
                 "a device-plugin pod running")
        switched = gpunode("deploy", INVENTORY, *DEPLOY, "--data", "gpu_allocation=dra", env=env, check=False,
                           timeout=900)
        info["switch"] = switched.stdout + switched.stderr
        assert switched.returncode == 0, switched.stdout[-4000:] + switched.stderr[-2000:]
        yield info
    finally:
        gpunode("sim", "down", env=env, check=False)


def api(fleet: dict) -> Client:
    return Client(KubeConfig.from_file(Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "kubeconfig").get("gpunode-sim"),
                  trust_env=False)


def node_gpus(fleet: dict) -> list[str]:
    return [gpu["uuid"] for gpu in json.loads(ssh_ok(fleet, "node01", "cat /etc/gpunode-sim/gpu.json"))["gpus"]]


def the_slice(client: Client) -> object:
    found = [s for s in client.list(ResourceSlice) if s["spec"]["driver"] == DRIVER]
    return found[0] if len(found) == 1 else None


def gpu_pod(name: str, claims: list[dict], command: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "runtimeClassName": "nvidia", "resourceClaims": claims,
                     "containers": [{"name": "c", "image": "docker.io/library/gpunode-workload:1",
                                     "imagePullPolicy": "Never", "command": ["sh", "-c", command],
                                     "resources": {"claims": [{"name": c["name"]} for c in claims]}}]}}


def dp_pod(number: int) -> dict:
    body = gpu_pod(f"dp-latency-{number}", [], "nvidia-smi -L; sleep 600")
    del body["spec"]["resourceClaims"]
    container = body["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return body


def time_to_gpus(client: Client, pod: object) -> float:
    """Seconds from creating ``pod`` to its container listing a GPU (then the pod is deleted, and gone)."""
    name = pod.metadata.name  # type: ignore[attr-defined]
    started = time.monotonic()
    client.create(pod)

    def listing() -> bool:
        found = client.get(Pod, name, namespace="default")
        assert found.status.phase in ("Pending", "Running"), found.status
        return found.status.phase == "Running" and "GPU " in "".join(client.log(name, namespace="default"))

    wait_for(listing, 120, f"pod {name} to list its GPUs", every=0.1)
    took = time.monotonic() - started
    client.delete(Pod, name, namespace="default", grace_period=0)
    wait_for(lambda: not [p for p in client.list(Pod, namespace="default") if p.metadata.name == name], 120,
             f"pod {name} gone")
    return took


def template(name: str, count: int) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}}]}}}}


def finished(client: Client, name: str, timeout: float = 120) -> tuple[str, str]:
    def phase() -> str | None:
        found = client.get(Pod, name, namespace="default").status.phase
        return found if found in ("Succeeded", "Failed") else None

    try:
        phase_now = wait_for(phase, timeout, f"pod {name} to end")
    except AssertionError:
        pod = client.get(Pod, name, namespace="default")
        raise AssertionError(f"pod {name}: {pod.status}") from None
    log = "".join(client.log(name, namespace="default"))
    return str(phase_now), log


def listed(log: str) -> list[str]:
    return [line.split("(UUID: ")[1].rstrip(")") for line in log.splitlines() if line.startswith("GPU ")]


def delete_pods(client: Client, *names: str) -> None:
    for name in names:
        try:
            client.delete(Pod, name, namespace="default", grace_period=0)
        except ApiError:
            pass


def wait_unprepared(fleet: dict, what: str) -> None:
    """Until the node holds no claim's CDI spec of the driver: every claim unprepared."""
    wait_for(lambda: not ssh_ok(fleet, "node01", f"ls /var/run/cdi | grep {DRIVER}-claim- || true").strip(), 120,
             what)


def doctor_report(fleet: dict, *args: str) -> dict:
    result = gpunode("doctor", INVENTORY, "--json", *args, env=fleet["env"], check=False)
    return json.loads(result.stdout)


def pod_problem(fleet: dict, client: Client, name: str) -> dict:
    """Once the scheduler has said why pod ``name`` waits: doctor --pod's problem for it (the report if none)."""
    wait_for(lambda: [e for e in client.list(Event, namespace="default", fields={"involvedObject.name": name})
                      if e.reason == "FailedScheduling"], 60, f"the scheduler's word on pod {name}")
    report = doctor_report(fleet, "--pod", f"default/{name}")
    found = [p for p in report["problems"] if p["subject"] == f"pod default/{name}"]
    assert found, report
    return found[0]


def test_the_driver_publishes_the_nodes_gpus_as_a_resource_slice(dra: dict) -> None:
    client = api(dra)
    found = wait_for(lambda: the_slice(client), 120, "the driver's ResourceSlice")
    devices = found["spec"]["devices"]
    assert found["spec"]["nodeName"] == "node01" and found["spec"]["pool"]["name"] == "node01"
    assert [d["name"] for d in devices] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert [d["attributes"]["uuid"]["string"] for d in devices] == node_gpus(dra)
    assert devices[0]["attributes"]["productName"]["string"].startswith("NVIDIA A100")
    assert devices[0]["attributes"]["driverVersion"]["version"] and devices[0]["capacity"]["memory"]["value"]
    listing = ssh_ok(dra, "node01", "ls /var/lib/kubelet/plugins_registry")
    assert f"{DRIVER}-reg.sock" in listing


def test_the_deploy_moved_the_node_to_dra_through_a_drain(dra: dict, tmp_path: Path) -> None:
    """gpu_allocation = dra on a node the device plugin served: the deploy cordoned it, evicted its running GPU pod,
    moved its label from the device plugin to the DRA driver, waited for its ResourceSlice and uncordoned it; verify
    proves the node's device_plugin link by the slice, with no nvidia.com/gpu offered beside it."""
    client = api(dra)
    said = dra["switch"]
    assert "moving from device-plugin to dra" in said and "evicted default/dp-latency-7" in said, said[-4000:]
    assert "device(s) in its ResourceSlice from gpu.gpunode.io" in said, said[-4000:]
    node = client.get(Node, "node01")
    assert node.metadata.labels.get(DRA_LABEL) == "true" and PLUGIN_LABEL not in node.metadata.labels
    assert not node.spec.unschedulable
    assert (node.status.allocatable or {}).get("nvidia.com/gpu", "0") == "0"
    assert not [p for p in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name":
                                                                          "gpunode-device-plugin"})]
    out = tmp_path / "verify.json"
    result = gpunode("verify", INVENTORY, "--json", str(out), *DEPLOY, "--data", "gpu_allocation=dra",
                     env=dra["env"], check=False)
    link = json.loads(out.read_text())["hosts"]["node01"]["device_plugin"]
    print(yaml.safe_dump(link))
    assert result.returncode == 0 and link["state"] == "ok", result.stdout[-3000:]
    assert any(f"spec.driver={DRIVER}: 4 device(s)" in line for line in link["proof"]), link


def test_the_node_checker_proves_a_dra_nodes_link_by_its_own_slice(dra: dict, tmp_path: Path) -> None:
    """The node checker on a DRA node (its settings carry gpu_allocation = dra) reads its own node's ResourceSlice
    by name and publishes the device_plugin link True; verify --in-cluster reads that verdict, the slice its
    proof."""
    from gpunode.verify.node_conditions import CONDITIONS

    from .test_whole_chain import CHECKER, wait_for_condition

    with_checker = {**dra["env"], "GPUNODE_SIM_CHECKER": "on"}
    deployed = gpunode("deploy", INVENTORY, "device_plugin", *DEPLOY, "--data", "gpu_allocation=dra",
                       env=with_checker, check=False, timeout=900)
    client = api(dra)
    try:
        assert deployed.returncode == 0, deployed.stdout[-3000:] + deployed.stderr[-2000:]
        status, reason, message = wait_for_condition(dra, "node01", CONDITIONS["device_plugin"], "True", 180)
        assert reason == "Verified", (status, reason, message)
        out = tmp_path / "in-cluster.json"
        result = gpunode("verify", INVENTORY, "--in-cluster", "--json", str(out), *DEPLOY, "--data",
                         "gpu_allocation=dra", env=dra["env"], check=False)
        link = json.loads(out.read_text())["hosts"]["node01"]["device_plugin"]
        assert result.returncode == 0 and link["state"] == "ok", result.stdout[-3000:]
        assert any(f"spec.driver={DRIVER}: 4 device(s) (gpu-0, gpu-1, gpu-2, gpu-3)" in line
                   for line in link["proof"]), link
    finally:
        client.delete(DaemonSet, CHECKER, namespace=NAMESPACE)
        wait_for(lambda: not list(client.list(Pod, namespace=NAMESPACE,
                                              labels={"app.kubernetes.io/name": CHECKER})), 90, "checker pods gone")


@pytest.mark.parametrize("count", [1, 2])
def test_a_pod_with_a_claim_template_sees_exactly_its_claimed_gpus(dra: dict, count: int) -> None:
    client = api(dra)
    name = f"claims-{count}"
    client.apply(codecs.from_dict(template(name, count)), field_manager="gpunode-test", force=True)
    # it lists its GPUs, then waits to be deleted: its generated claim lives as long as the pod runs
    client.create(codecs.from_dict(gpu_pod(name, [{"name": "gpus", "resourceClaimTemplateName": name}],
                                           "nvidia-smi -L; sleep 600")))
    try:
        def running() -> bool:
            pod = client.get(Pod, name, namespace="default")
            assert pod.status.phase in ("Pending", "Running"), pod.status
            return pod.status.phase == "Running" and "GPU " in "".join(client.log(name, namespace="default"))

        wait_for(running, 120, f"pod {name} to list its GPUs")
        log = "".join(client.log(name, namespace="default"))
        generated = client.get(Pod, name, namespace="default").status.resourceClaimStatuses[0].resourceClaimName
        claim = client.get(ResourceClaim, generated, namespace="default")
        results = claim["status"]["allocation"]["devices"]["results"]
        uuids = node_gpus(dra)
        print(f"claim {generated}: {[r['device'] for r in results]}; the container lists {listed(log)}")
        assert sorted(listed(log)) == sorted(uuids[int(r["device"].split("-")[1])] for r in results)
        assert len(listed(log)) == count and {r["driver"] for r in results} == {DRIVER}
    finally:
        client.delete(Pod, name, namespace="default", grace_period=0)


def test_two_pods_share_one_claim_and_a_restarted_driver_keeps_what_it_prepared(dra: dict) -> None:
    client = api(dra)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "shared", "namespace": "default"},
             "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS}}]}}}
    client.apply(codecs.from_dict(claim), field_manager="gpunode-test", force=True)
    holder = gpu_pod("holder", [{"name": "gpus", "resourceClaimName": "shared"}], "nvidia-smi -L; sleep 600")
    client.create(codecs.from_dict(holder))
    try:
        wait_for(lambda: client.get(Pod, "holder", namespace="default").status.phase == "Running", 120, "holder")
        uid = client.get(ResourceClaim, "shared", namespace="default")["metadata"]["uid"]
        spec = f"/var/run/cdi/{DRIVER}-claim-{uid}.json"
        before = ssh_ok(dra, "node01", f"cat {spec}")
        driver_pod = next(p for p in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": NAME}))
        client.delete(Pod, driver_pod.metadata.name, namespace=NAMESPACE)
        wait_for(lambda: [p for p in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": NAME})
                          if p.metadata.name != driver_pod.metadata.name and p.status.phase == "Running"], 120,
                 "a new driver pod")
        client.create(codecs.from_dict(gpu_pod("sharer", [{"name": "gpus", "resourceClaimName": "shared"}],
                                               "nvidia-smi -L")))
        phase, log = finished(client, "sharer")
        held = "".join(client.log("holder", namespace="default"))
        assert phase == "Succeeded" and listed(log) == listed(held) and len(listed(log)) == 1, (log, held)
        assert ssh_ok(dra, "node01", f"cat {spec}") == before  # prepared once, kept across the driver's restart
        checkpoint = json.loads(ssh_ok(dra, "node01", f"cat /var/lib/kubelet/plugins/{DRIVER}/checkpoint.json"))
        assert checkpoint["claims"][uid]["name"] == "shared"
    finally:
        delete_pods(client, "holder", "sharer")
    wait_unprepared(dra, "every claim unprepared (the shared one by the new driver)")
    client.delete(ResourceClaim, "shared", namespace="default")


def test_a_claim_the_scheduler_cannot_allocate_is_followed_by_doctor(dra: dict) -> None:
    """Three GPUs held by one pod's claim, a second pod's claim asks for two: the scheduler says only "cannot
    allocate all claims"; doctor --pod names the claim, what it asks, the node's devices and who holds them."""
    client = api(dra)
    client.apply(codecs.from_dict(template("three", 3)), field_manager="gpunode-test", force=True)
    client.apply(codecs.from_dict(template("two", 2)), field_manager="gpunode-test", force=True)
    client.create(codecs.from_dict(gpu_pod("three", [{"name": "gpus", "resourceClaimTemplateName": "three"}],
                                           "nvidia-smi -L; sleep 600")))
    try:
        wait_for(lambda: client.get(Pod, "three", namespace="default").status.phase == "Running", 120, "three")
        client.create(codecs.from_dict(gpu_pod("two", [{"name": "gpus", "resourceClaimTemplateName": "two"}],
                                               "nvidia-smi -L")))
        found = pod_problem(dra, client, "two")
        assert found["code"] == "claim-unallocatable", found
        evidence = "\n".join(found["evidence"])
        print(evidence)
        assert "cannot allocate all claims" in evidence
        assert f"requests gpus: 2 x {GPU_CLASS}, not allocated" in evidence
        assert f"resourceslices of node01: 4 device(s) from {DRIVER}, 3 allocated" in evidence
        assert "most free devices of one driver on one node: 1" in found["what"]
    finally:
        delete_pods(client, "three", "two")
    wait_unprepared(dra, "every claim unprepared")


@pytest.mark.parametrize(("wrong", "code", "linted"), [
    # a model the node has not got: every GPU free, the scheduler allocates none ("cannot allocate all claims")
    ("productName == 'NVIDIA B300'", "claim-selector-matches-none", ""),
    # a misspelt attribute: the scheduler's CEL evaluation fails on each device ("no such key"), which lint foresees
    ("productname == 'NVIDIA A100-SXM4-40GB'", "claim-selector-error", "did you mean productName?"),
])
def test_a_device_class_whose_selector_matches_no_device_is_named(dra: dict, tmp_path: Path, wrong: str, code: str,
                                                                   linted: str) -> None:
    """A class whose selector no device passes: doctor --pod says why with the scheduler's words and quotes the
    selector; gpunode lint warns of the class before it is applied where the selector cannot work at all."""
    client = api(dra)
    expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].{wrong}"
    device_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "wrong-test"},
                    "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    (tmp_path / "class.yaml").write_text(yaml.safe_dump(device_class))
    lint = gpunode("lint", str(tmp_path / "class.yaml"), env=dra["env"], check=False)
    assert (linted in lint.stdout) if linted else lint.returncode == 0, lint.stdout + lint.stderr
    client.apply(codecs.from_dict(device_class), field_manager="gpunode-test", force=True)
    claim_template = template("wrong", 1)
    claim_template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "wrong-test"
    client.apply(codecs.from_dict(claim_template), field_manager="gpunode-test", force=True)
    client.create(codecs.from_dict(gpu_pod("wrong", [{"name": "gpus", "resourceClaimTemplateName": "wrong"}],
                                           "nvidia-smi -L")))
    try:
        found = pod_problem(dra, client, "wrong")
        assert found["code"] == code, found
        assert f"deviceclass wrong-test: selector {expression}" in found["evidence"], found
    finally:
        client.delete(Pod, "wrong", namespace="default", grace_period=0)
        client.delete(DeviceClass, "wrong-test")
        client.delete(ResourceClaimTemplate, "wrong", namespace="default")


def test_an_xid_takes_the_gpu_out_of_the_resource_slice(dra: dict) -> None:
    client = api(dra)
    gpu = node_gpus(dra)[2]
    ssh_ok(dra, "node01", f"echo '{gpu} 79' >> /run/gpunode-sim/events/health-events")
    found = wait_for(lambda: (s := the_slice(client)) and len(s["spec"]["devices"]) == 3 and s, 60,
                     "the slice without the GPU")
    assert gpu not in [d["attributes"]["uuid"]["string"] for d in found["spec"]["devices"]]
    print(yaml.safe_dump({"slice generation": found["spec"]["pool"]["generation"]}))


def test_claim_to_running_latency_and_the_drivers_memory(dra: dict) -> None:
    """Measured, printed (-s): a claim's pod against the device plugin's on the same node kind, and the driver's
    RSS. Both paths are the kubelet's admission, the runtime's container start and the probe; DRA adds the
    claim's creation from its template, the scheduler's allocation and the driver's prepare."""
    client = api(dra)
    client.apply(codecs.from_dict(template("latency", 1)), field_manager="gpunode-test", force=True)
    took = [time_to_gpus(client, codecs.from_dict(gpu_pod(f"dra-latency-{n}", [
        {"name": "gpus", "resourceClaimTemplateName": "latency"}], "nvidia-smi -L; sleep 600"))) for n in range(2)]
    rss = int(ssh_ok(dra, "node01", "grep VmRSS /proc/$(pgrep -f 'gpunode_plugin.dra_drive[r]' | head -1)/status")
              .split()[1])
    plugin = dra["device plugin"]
    print(f"create to GPUs listed, two pods each: DRA {min(took):.2f}-{max(took):.2f} s, device plugin "
          f"{min(plugin):.2f}-{max(plugin):.2f} s; the DRA driver's RSS {rss / 1024:.0f} MiB")
    assert max(took) < 60 and rss < 128 * 1024


def test_a_pod_asking_nvidia_com_gpu_is_served_through_dra_where_the_class_maps_it(dra: dict) -> None:
    """KEP-5004: the GPU DeviceClass names the extended resource; on a node without the device plugin, a pod that
    asks nvidia.com/gpu: 1, unchanged, gets one GPU through a claim the scheduler makes for it."""
    client = api(dra)
    mapped = device_classes("nvidia.com/gpu")[0]
    client.apply(codecs.from_dict(mapped), field_manager="gpunode-test", force=True)
    try:
        pod = dp_pod(9)
        pod["metadata"]["name"] = "unchanged"
        client.create(codecs.from_dict(pod))
        try:
            def listing() -> bool:
                found = client.get(Pod, "unchanged", namespace="default")
                assert found.status.phase in ("Pending", "Running"), found.status
                return found.status.phase == "Running" and "GPU " in "".join(client.log("unchanged",
                                                                                     namespace="default"))

            try:
                wait_for(listing, 90, "the unchanged pod to list its GPU")
            except AssertionError:
                found = client.get(Pod, "unchanged", namespace="default")
                raise AssertionError(f"{found.status}") from None
            log = "".join(client.log("unchanged", namespace="default"))
            status = client.get(Pod, "unchanged", namespace="default").status
            print(f"nvidia.com/gpu through DRA: {listed(log)}; claim {status.extendedResourceClaimStatus}")
            assert len(listed(log)) == 1
        finally:
            client.delete(Pod, "unchanged", namespace="default", grace_period=0)
    finally:
        client.apply(codecs.from_dict(device_classes()[0]), field_manager="gpunode-test", force=True)


def test_a_node_offered_by_the_device_plugin_too_is_named_offered_twice(dra: dict) -> None:
    """Someone labels the DRA node for gpunode's device plugin by hand: its DaemonSet lands there, the node's GPUs
    are offered twice, and doctor names it at the device_plugin link."""
    client = api(dra)
    client.patch(Node, "node01", {"metadata": {"labels": {PLUGIN_LABEL: "true"}}}, field_manager="gpunode-test")
    try:
        wait_for(lambda: int((client.get(Node, "node01").status.allocatable or {}).get("nvidia.com/gpu", "0")) > 0,
                 150, "the device plugin's GPUs on node01")
        report = doctor_report(dra, *DEPLOY, "--data", "gpu_allocation=dra")
        found = [p for p in report["problems"] if p["subject"] == "node01" and p["link"] == "device_plugin"]
        assert found and found[0]["code"] == "offered-twice", report
        # 3 or 4 devices: the Xid test above took one out of the slice (a new plugin hears only later Xids)
        assert [e for e in found[0]["evidence"] if e.startswith("kubectl get resourceslices (node node01): ")
                and e.endswith(f"device(s) from {DRIVER}")], found[0]
    finally:
        client.patch(Node, "node01", {"metadata": {"labels": {PLUGIN_LABEL: None}}}, field_manager="gpunode-test")
        wait_for(lambda: not [p for p in client.list(Pod, namespace=NAMESPACE, labels={
            "app.kubernetes.io/name": "gpunode-device-plugin"})], 120, "the device plugin gone from node01")


def test_a_claim_whose_driver_is_gone_from_the_node_is_named_by_doctor(dra: dict) -> None:
    """The driver's DaemonSet moved off node01 (a node selector no node has) with its ResourceSlice left: the
    scheduler still allocates the claim, the kubelet cannot have it prepared; doctor --pod quotes the kubelet's
    FailedPrepareDynamicResources event and points at the driver's pod on the node. Once the kubelet has dropped
    the slice, doctor names the node's link (no ResourceSlice from the driver). The driver put back after."""
    client = api(dra)
    wait_for(lambda: the_slice(client), 120, "the driver's ResourceSlice")
    away = {"spec": {"template": {"spec": {"nodeSelector": {"gpunode.io/no-such-node": "true"}}}}}
    client.patch(DaemonSet, NAME, away, namespace=NAMESPACE)
    try:
        for pod in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": NAME}):
            client.delete(Pod, pod.metadata.name, namespace=NAMESPACE, grace_period=0)
        wait_for(lambda: "gpunode_plugin.dra_driver" not in ssh_ok(dra, "node01", "ps -eo args"), 120,
                 "the driver's process gone from node01")
        client.apply(codecs.from_dict(template("orphan", 1)), field_manager="gpunode-test", force=True)
        client.create(codecs.from_dict(gpu_pod("orphan", [{"name": "gpus", "resourceClaimTemplateName": "orphan"}],
                                               "nvidia-smi -L")))
        try:
            events = wait_for(lambda: [e for e in client.list(Event, namespace="default",
                                                              fields={"involvedObject.name": "orphan"})
                                       if e.reason == "FailedPrepareDynamicResources"], 120,
                              "the kubelet's FailedPrepareDynamicResources")
            print(f"the kubelet: {events[0].message}")
            report = doctor_report(dra, "--pod", "default/orphan")
            found = [p for p in report["problems"] if p["subject"] == "pod default/orphan"]
            assert found and found[0]["code"] == "claim-prepare-failed", report
            evidence = "\n".join(found[0]["evidence"])
            assert "event FailedPrepareDynamicResources: Failed to prepare dynamic resources" in evidence, evidence
            assert DRIVER in evidence and "node01" in found[0]["fix"], found[0]
        finally:
            client.delete(Pod, "orphan", namespace="default", grace_period=0)
        # the kubelet drops the slices of a driver that stays unregistered: then the node's own link fails
        wait_for(lambda: the_slice(client) is None, 300, "the kubelet to remove the driver's ResourceSlice")
        report = doctor_report(dra, *DEPLOY, "--data", "gpu_allocation=dra")
        found = [p for p in report["problems"] if p["subject"] == "node01" and p["link"] == "device_plugin"]
        assert found and found[0]["code"] == "dra-slice-missing", report
        print(f"doctor: {found[0]['what']}")
        assert f"spec.driver={DRIVER}: 0 device(s)" in found[0]["evidence"][0], found[0]
        assert "gpunode-dra-driver" in found[0]["fix"], found[0]
    finally:
        back = {"spec": {"template": {"spec": {"nodeSelector": {"gpunode.io/no-such-node": None}}}}}
        client.patch(DaemonSet, NAME, back, namespace=NAMESPACE)
    wait_for(lambda: [p for p in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name": NAME})
                      if p.status.phase == "Running"], 120, "the driver back on node01")


def test_a_changed_driver_restarts_the_dra_driver_and_waits_for_its_new_pod(dra: dict) -> None:
    """node01's driver upgraded and the node rebooted outside gpunode: the deploy relabels the node, restarts the
    DRA driver's pod (it would keep the old driver's NVML loaded) and waits for its successor before it calls the
    slice proof; the slice then carries the new driver's version."""
    from gpunode_plugin.dra_devices import semver

    from .test_upgrades import NEW_DRIVER

    client = api(dra)

    def driver_pod() -> str:
        pods = [p for p in client.list(Pod, namespace=NAMESPACE, labels={"app.kubernetes.io/name":
                                                                          "gpunode-dra-driver"})
                if p.spec.nodeName == "node01" and not p.metadata.deletionTimestamp]
        return pods[0].metadata.name if pods else ""

    before = wait_for(driver_pod, 60, "the DRA driver's pod on node01")
    gpunode("sim", "driver", "node01", "--version", NEW_DRIVER, env=dra["env"], timeout=600)
    result = gpunode("deploy", INVENTORY, *DEPLOY, "--data", "gpu_allocation=dra", env=dra["env"], check=False,
                     timeout=900)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-4000:]
    assert f"-> {NEW_DRIVER}: restarted gpunode's DRA driver (gpunode-dra-driver) ({before})" in said, said[-4000:]
    after = driver_pod()
    assert after and after != before
    versions = wait_for(lambda: {d["attributes"]["driverVersion"]["version"] for d in the_slice(client)["spec"][
        "devices"]} == {semver(NEW_DRIVER)} or None, 60, "the new driver's version in the slice")
    assert versions


@pytest.mark.parametrize("strategy", ["cdi-cri", "cdi-annotations"])
def test_a_cdi_strategy_hands_a_pod_its_gpu_through_the_nodes_own_spec(dra: dict, strategy: str) -> None:
    """node01 back on the device plugin with a CDI device-list strategy: the plugin names the GPU in the kind of the
    node's spec (nvidia.com/gpu, written by NVIDIA's nvidia-ctk cdi generate over the simulated NVML), the real
    kubelet hands the name (a CRI CDI device, or the plugin's annotation) to containerd 1.7, which resolves it from
    /etc/cdi and injects what NVIDIA's spec lists into a plain runc container: exactly that GPU's device node beside
    the control nodes, the driver's library, and the links NVIDIA's nvidia-cdi-hook makes."""
    client = api(dra)
    deployed = gpunode("deploy", INVENTORY, "--data", "cdi_enabled=True", "--data",
                       f"plugin_device_list_strategy={strategy}", env=dra["env"], check=False, timeout=900)
    assert deployed.returncode == 0, deployed.stdout[-4000:] + deployed.stderr[-2000:]
    node = client.get(Node, "node01")
    assert node.metadata.labels.get(PLUGIN_LABEL) == "true" and DRA_LABEL not in node.metadata.labels
    spec = yaml.safe_load(ssh_ok(dra, "node01", "cat /etc/cdi/nvidia.yaml"))
    assert spec["kind"] == "nvidia.com/gpu"
    minors = {d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]}
    name = f"cdi-{strategy}"
    body = gpu_pod(name, [], "ls /dev; ls /usr/lib/x86_64-linux-gnu; nvidia-smi -L")
    del body["spec"]["resourceClaims"], body["spec"]["runtimeClassName"]  # runc: CDI alone gives the GPU
    body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    client.create(codecs.from_dict(body))
    try:
        wait_for(lambda: client.get(Pod, name, namespace="default").status.phase in ("Succeeded", "Failed"), 120,
                 f"pod {name} to finish")
        pod = client.get(Pod, name, namespace="default")
        log = "".join(client.log(name, namespace="default"))
        events = [f"{e.reason}: {e.message}" for e in client.list(Event, namespace="default",
                                                                  fields={"involvedObject.name": name})]
        assert pod.status.phase == "Succeeded", (log, events)
        listed = log.split()
        gpus = sorted(entry for entry in listed if entry.startswith("nvidia") and entry[6:].isdigit())
        assert len(gpus) == 1 and {"nvidiactl", "nvidia-uvm"} <= set(listed), log
        assert f"/dev/{gpus[0]}" in minors.values(), (gpus, minors)
        mounted = sorted({m["containerPath"] for m in spec["containerEdits"].get("mounts") or []})
        assert [p for p in mounted if "libnvidia-ml.so" in p], mounted  # the driver's NVML, as the spec mounts it
        assert "libnvidia-ml.so" in log, (log, mounted)
        # the driver's nvidia-smi, mounted by the spec, lists that one GPU (the simulated hardware reached through
        # the driver's firmware folder the spec mounts too)
        node_state = json.loads(ssh_ok(dra, "node01", "cat /etc/gpunode-sim/gpu.json"))
        uuid = next(g["uuid"] for g in node_state["gpus"] if f"nvidia{g['minor']}" == gpus[0])
        assert [line for line in log.splitlines() if line.startswith("GPU ")] == [
            f"GPU 0: {node_state['gpus'][0]['name']} (UUID: {uuid})"], log
        print(f"{strategy}: the container saw {gpus[0]} (of {len(set(minors.values()))} in the node's spec); the "
              f"spec mounts {mounted}")
    finally:
        client.delete(Pod, name, namespace="default", grace_period=0)


def test_the_failures_of_a_device_node_under_cdi_are_the_real_stacks(dra: dict) -> None:
    """The node faults whose failure differs under CDI, on node01 with the cdi-cri strategy (containerd 1.7 injects
    what NVIDIA's generated spec lists, the CDI library's code): a host /dev/nvidiactl closed to other users (0600)
    stops no non-root container, as the library has the runtime create the container's device nodes for the
    container's user (the legacy runtime's bind mount fails it: tests/test_whole_chain.py), while doctor still names
    the node's mode; nvidia_uvm missing after a reboot (the spec, written before, names /dev/nvidia-uvm) makes
    containerd refuse every GPU container with the library's words, which doctor --pod names, and doctor names the
    unloaded module on the node."""
    client = api(dra)
    deployed = gpunode("deploy", INVENTORY, "--data", "cdi_enabled=True", "--data",
                       "plugin_device_list_strategy=cdi-cri", env=dra["env"], check=False, timeout=900)
    assert deployed.returncode == 0, deployed.stdout[-4000:] + deployed.stderr[-2000:]
    assert "/dev/nvidia-uvm" in ssh_ok(dra, "node01", "cat /etc/cdi/nvidia.yaml")
    names = ("cdi-non-root", "cdi-no-uvm")
    try:
        gpunode("sim", "fault", "node01", "nvidiactl-0600", env=dra["env"], timeout=300)
        assert ssh_ok(dra, "node01", "stat -c %a /dev/nvidiactl").strip() == "600"
        body = gpu_pod(names[0], [], "ls -ln /dev/nvidiactl; nvidia-smi -L")
        del body["spec"]["resourceClaims"], body["spec"]["runtimeClassName"]
        body["spec"]["securityContext"] = {"runAsUser": 1000}
        body["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
        client.create(codecs.from_dict(body))
        phase, log = finished(client, names[0])
        assert phase == "Succeeded" and [line for line in log.splitlines() if line.startswith("GPU 0: ")], log
        assert log.split()[2] == "1000" and log.startswith("crw-rw-rw-"), log  # the container user's node, 0666
        found = [p for p in doctor_report(dra)["problems"] if p["subject"] == "node01"]
        assert [(p["link"], p["code"]) for p in found] == [("driver", "device-mode")], found
        assert "containers given GPUs through CDI, still work" in found[0]["what"], found

        gpunode("sim", "fault", "node01", "uvm-missing", env=dra["env"], timeout=300)
        body["metadata"]["name"] = names[1]
        del body["spec"]["securityContext"]
        client.create(codecs.from_dict(body))

        def refused() -> str:
            statuses = client.get(Pod, names[1], namespace="default").status.containerStatuses or []
            waiting = [s.state.waiting for s in statuses if s.state and s.state.waiting]
            return waiting[0].message or "" if waiting and waiting[0].reason == "CreateContainerError" else ""

        message = str(wait_for(refused, 120, "containerd to refuse the container"))
        assert 'failed to stat CDI host device "/dev/nvidia-uvm": no such file or directory' in message, message
        report = doctor_report(dra, "--pod", f"default/{names[1]}")
        pod = next(p for p in report["problems"] if p["subject"] == f"pod default/{names[1]}")
        assert pod["code"] == "cdi-device-node-missing" and "gpunode doctor --limit node01" in pod["fix"], pod
        node = next(p for p in report["problems"] if p["subject"] == "node01")
        assert (node["link"], "nvidia_uvm is not loaded" in node["what"]) == ("driver", True), node
    finally:
        delete_pods(client, *names)
        gpunode("sim", "fault", "node01", "--clear", env=dra["env"], timeout=300)
    assert wait_for(lambda: doctor_report(dra)["problems"] == [] or None, 120, "doctor's clean verdict")
