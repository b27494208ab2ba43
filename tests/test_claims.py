"""doctor --pod follows a pod's ResourceClaims: the claims it names (by name or made from a template), what they
ask, what each node's ResourceSlices offer and who holds those devices; judged when the scheduler cannot allocate."""

from __future__ import annotations

from gpunode.diagnosis.pods import PodView, diagnose
from gpunode.facts.claims import DraView, allocated_devices, claim_view, offered_devices, pod_claim_names

DRIVER = "gpu.gpunode.io"
# the scheduler's message as it assembles one from the dynamicresources plugin's reason (k8s.io/kubernetes v1.37.2,
# pkg/scheduler/framework/plugins/dynamicresources: "cannot allocate all claims")
CANNOT = "0/1 nodes are available: 1 cannot allocate all claims. preemption: 0/1 nodes are available: 1 Preemption " \
         "is not helpful for scheduling."
POD = {"spec": {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two"},
                                   {"name": "shared", "resourceClaimName": "team-gpu"}]},
       "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "two-gpus-x7k2p"}]}}


def claim(name: str, count: int, devices: list[str]) -> dict:
    return {"metadata": {"namespace": "ml", "name": name},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpus", "driver": DRIVER, "pool": "node01", "device": d} for d in devices]}}}
            if devices else {}}


def test_the_pods_claims_are_found_by_name_and_from_its_templates() -> None:
    assert pod_claim_names(POD) == [("gpus", "two-gpus-x7k2p"), ("shared", "team-gpu")]
    fresh = {"spec": POD["spec"], "status": {}}  # the template's claim not made yet
    assert pod_claim_names(fresh) == [("gpus", ""), ("shared", "team-gpu")]
    assert pod_claim_names({"spec": {}}) == []


def test_a_claim_says_what_it_asks_and_what_it_holds() -> None:
    held = claim("three", 3, ["gpu-0", "gpu-1", "gpu-2"])
    view = claim_view("gpus", held, "three")
    assert view.requests == (f"gpus: 3 x {DRIVER}",)
    assert view.allocated == allocated_devices(held) == tuple(f"{DRIVER}/node01/gpu-{n}" for n in range(3))
    assert claim_view("gpus", None, "").requests == ()


def test_a_claim_the_scheduler_cannot_allocate_names_the_devices_and_their_holders() -> None:
    slices = [{"spec": {"driver": DRIVER, "nodeName": "node01", "pool": {"name": "node01"},
                        "devices": [{"name": f"gpu-{n}"} for n in range(4)]}}]
    dra = DraView((claim_view("gpus", claim("two", 2, []), "two-gpus-x7k2p"),), offered_devices(slices),
                  {f"{DRIVER}/node01/gpu-{n}": "ml/three" for n in range(3)})
    view = PodView("ml", "p", "Pending", {"containers": [{"name": "c"}]}, [("FailedScheduling", CANNOT)], dra=dra)
    [finding] = diagnose(view, [], [])
    assert finding.code == "claim-unallocatable"
    assert "(most free devices of one driver on one node: 1)" in finding.what
    assert f"resourceclaim two-gpus-x7k2p: requests gpus: 2 x {DRIVER}, not allocated" in finding.evidence
    assert (f"resourceslices of node01: 4 device(s) from {DRIVER}, 3 allocated (node01/gpu-0 by ml/three, "
            "node01/gpu-1 by ml/three, node01/gpu-2 by ml/three)") in finding.evidence
    assert finding.evidence[0] == f"event FailedScheduling: {CANNOT}"


def test_no_resource_slice_anywhere_is_the_drivers_absence() -> None:
    dra = DraView((claim_view("gpus", claim("two", 2, []), "two"),))
    view = PodView("ml", "p", "Pending", {"containers": [{"name": "c"}]}, [("FailedScheduling", CANNOT)], dra=dra)
    [finding] = diagnose(view, [], [])
    assert finding.code == "claim-no-devices" and "kubectl get resourceslices: none" in finding.evidence


def test_a_node_offered_by_a_device_plugin_and_a_dra_driver_is_offered_twice() -> None:
    from gpunode.diagnosis.device_plugin import offered_twice
    from gpunode.facts.labels import NodeLabelsState

    node = NodeLabelsState("node01", exists=True, allocatable={"nvidia.com/gpu": "4"})
    drivers = offered_devices([{"spec": {"driver": DRIVER, "nodeName": "node01", "pool": {"name": "node01"},
                                         "devices": [{"name": f"gpu-{n}"} for n in range(4)]}}])["node01"]
    finding = offered_twice(node, "nvidia.com/gpu", drivers)
    assert finding is not None and finding.code == "offered-twice"
    assert finding.evidence == ["kubectl get node node01: allocatable nvidia.com/gpu=4",
                                f"kubectl get resourceslices (node node01): 4 device(s) from {DRIVER}"]
    assert offered_twice(node, "nvidia.com/gpu", {}) is None  # the device plugin alone
    assert offered_twice(node, "nvidia.com/gpu", {"sriov.example.com": ["pool/nic-0"]}) is None  # a NIC's driver
    alone = NodeLabelsState("node01", exists=True, allocatable={"nvidia.com/gpu": "0"})
    assert offered_twice(alone, "nvidia.com/gpu", drivers) is None  # DRA alone: the plugin is off the node


def test_free_devices_the_scheduler_does_not_allocate_point_at_the_selectors() -> None:
    """Enough devices free, none allocated: the class's (or the request's) selectors match none of them."""
    slices = [{"spec": {"driver": DRIVER, "nodeName": "node01", "pool": {"name": "node01"},
                        "devices": [{"name": f"gpu-{n}"} for n in range(4)]}}]
    wrong = "device.driver == 'gpu.gpunode.io' && device.attributes['gpu.gpunode.io'].productName == 'NVIDIA B300'"
    asked = claim("b300", 1, [])
    asked["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "b300"
    dra = DraView((claim_view("gpus", asked, "b300-gpus-k2"),), offered_devices(slices), {},
                  {"b300": (wrong,)})
    view = PodView("ml", "p", "Pending", {"containers": [{"name": "c"}]}, [("FailedScheduling", CANNOT)], dra=dra)
    [finding] = diagnose(view, [], [])
    assert finding.code == "claim-selector-matches-none"
    assert "enough devices are free (4 on one node, it asks for 1 per request)" in finding.what
    assert f"deviceclass b300: selector {wrong}" in finding.evidence


def test_a_selector_the_scheduler_cannot_evaluate_is_named_with_its_error() -> None:
    """The real scheduler's words (kube-scheduler v1.37.2 on the DRA fleet) for a class whose selector reads an
    attribute the driver does not publish: an error on every device, not "cannot allocate all claims"."""
    typo = "device.driver == 'gpu.gpunode.io' && device.attributes['gpu.gpunode.io'].productname == 'NVIDIA A100'"
    said = ('running "DynamicResources" filter plugin: class typo: selector #0 on device gpu.gpunode.io/node01/gpu-0: '
            "CEL runtime error: no such key: productname. consider using CEL optional chaining (.? followed by "
            "orValue()) or guarding the check with has() for optional fields")
    asked = claim("typo", 1, [])
    asked["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "typo"
    dra = DraView((claim_view("gpus", asked, "typo-gpus-k2"),), {}, {}, {"typo": (typo,)})
    view = PodView("ml", "p", "Pending", {"containers": [{"name": "c"}]}, [("FailedScheduling", said)], dra=dra)
    [finding] = diagnose(view, [], [])
    assert finding.code == "claim-selector-error" and "CEL runtime error" in finding.what
    assert finding.evidence == [f"event FailedScheduling: {said}", f"deviceclass typo: selector {typo}"]
    assert "'no such key' is an attribute the device does not have" in finding.fix
