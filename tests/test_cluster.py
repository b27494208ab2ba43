"""Cluster layer: labels from GPU facts (GFD-compatible) and manifests valid for each Kubernetes minor."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import kubernetes_validate
import pytest
from gpunode_sim.repos.aptrepo import render_standin
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile

from gpunode.cluster.labels import LabelSettings, gpu_labels, sanitise_product
from gpunode.cluster.manifests import ManifestSettings, documents, render
from gpunode.cluster.plugin_config import expected_offer, parse_plugin_config
from gpunode.diagnosis import Verdict
from gpunode.diagnosis import device_plugin as plugin_diagnosis
from gpunode.diagnosis import labels as label_diagnosis
from gpunode.errors import GpunodeError
from gpunode.facts.device_plugin import PluginPodState, RolloutState
from gpunode.facts.driver import QUERY_FIELDS, DriverState
from gpunode.facts.labels import NodeLabelsState, label_keys

from .conftest import REPO

KUBERNETES_MINORS = [f"1.{minor}.0" for minor in range(29, 38)]


def facts_of(profile: str, tmp_path: Path) -> dict:
    """DriverState parsed from the simulated nvidia-smi's real output for ``profile``."""
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps(driver_state("node01", load_profile(profile))))
    script = tmp_path / "nvidia-smi"
    script.write_text(render_standin("nvidia_smi.py"))
    out = subprocess.run([sys.executable, str(script), f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, env={"GPUNODE_SIM_GPU_STATE": str(state)}, check=False)
    lines = ["##gpunode:smi", *out.stdout.splitlines(), f"rc={out.returncode}"]
    return DriverState().process(lines)


def test_a100_node_labels(tmp_path: Path) -> None:
    labels = gpu_labels(facts_of("a100x4-containerd", tmp_path)["nvidia_smi"]["gpus"])
    assert labels.warnings == []
    assert labels.labels == {
        "accelerator": "nvidia-a100",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/cuda.driver.major": "550",
        "nvidia.com/cuda.driver.minor": "54",
        "nvidia.com/cuda.driver.rev": "15",
        "nvidia.com/mig.capable": "true",
        "gpunode.io/device-plugin": "true",  # gpunode's plugin serves it (no NVIDIA plugin there)
    }


@pytest.mark.parametrize(("profile", "expected"), [
    ("h100x8-nvswitch", {"accelerator": "nvidia-h100", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                         "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.memory": "81559",
                         "nvidia.com/gpu.count": "8"}),
    ("v100x2-docker", {"accelerator": "nvidia-v100", "nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB",
                       "nvidia.com/gpu.family": "volta", "nvidia.com/mig.capable": "false",
                       "nvidia.com/cuda.driver.major": "535"}),
])
def test_other_profiles(tmp_path: Path, profile: str, expected: dict) -> None:
    labels = gpu_labels(facts_of(profile, tmp_path)["nvidia_smi"]["gpus"]).labels
    assert {key: labels.get(key) for key in expected} == expected


def test_cpu_node_and_failed_driver_get_no_gpu_labels(tmp_path: Path) -> None:
    assert gpu_labels([]).labels == {}
    broken = dict(load_profile("a100x4-containerd"), faults=["driver-not-loaded"])
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps(driver_state("node01", broken)))
    script = tmp_path / "nvidia-smi"
    script.write_text(render_standin("nvidia_smi.py"))
    out = subprocess.run([sys.executable, str(script), f"--query-gpu={QUERY_FIELDS}", "--format=csv,noheader"],
                         capture_output=True, text=True, env={"GPUNODE_SIM_GPU_STATE": str(state)}, check=False)
    facts = DriverState().process(["##gpunode:smi", *out.stdout.splitlines(), f"rc={out.returncode}"])
    assert gpu_labels(facts["nvidia_smi"]["gpus"]).labels == {}


def test_mixed_models_take_the_majority_with_a_warning() -> None:
    def gpu(index: int, name: str, memory: int) -> dict:
        return {"index": index, "name": name, "memory_mib": memory, "driver_version": "550.54.15",
                "compute_cap": "8.0", "mig_mode": None, "uuid": f"GPU-{index}", "pci_bus_id": ""}

    result = gpu_labels([gpu(0, "NVIDIA A40", 46068), gpu(1, "NVIDIA A100-SXM4-40GB", 40960),
                         gpu(2, "NVIDIA A100-SXM4-40GB", 40960)])
    assert result.labels["accelerator"] == "nvidia-a100" and result.labels["nvidia.com/gpu.count"] == "2"
    assert "GPUs of 2 models on one node" in result.warnings[0]
    tie = gpu_labels([gpu(0, "NVIDIA A40", 46068), gpu(1, "NVIDIA A100-SXM4-40GB", 40960)])
    assert tie.labels["accelerator"] == "nvidia-a40"  # a tie goes to the lowest GPU index


@pytest.mark.parametrize(("name", "value"), [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"), ("NVIDIA A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA GeForce RTX 4090 (Laptop)", "NVIDIA-GeForce-RTX-4090-Laptop"), ("Tesla T4", "Tesla-T4"),
])
def test_product_is_sanitised_like_gfd(name: str, value: str) -> None:
    assert sanitise_product(name) == value


def test_model_label_key_and_prefix_are_inventory_data() -> None:
    settings = LabelSettings.from_data({"label_model_key": "gpu-model", "label_model_prefix": ""})
    gpus = [{"index": 0, "name": "Tesla T4", "memory_mib": 15109, "driver_version": "535.183.01",
             "compute_cap": "7.5", "mig_mode": None}]
    labels = gpu_labels(gpus, settings).labels
    assert labels["gpu-model"] == "t4" and labels["nvidia.com/gpu.family"] == "turing"


@pytest.mark.parametrize("version", KUBERNETES_MINORS)
@pytest.mark.parametrize("nvidia_default", [False, True])
def test_manifests_pass_schema_validation(version: str, nvidia_default: bool) -> None:
    docs = documents(render(ManifestSettings(nvidia_runtime_default=nvidia_default, mig_strategy="mixed")))
    assert [d["kind"] for d in docs] == ["Namespace", "ServiceAccount"] + (
        [] if nvidia_default else ["RuntimeClass"]) + ["DaemonSet"]
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_daemonset_runs_on_gpu_nodes_only_with_the_plugin_socket_dir() -> None:
    daemonset = documents(render(ManifestSettings()))[-1]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpunode.io/device-plugin": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_bad_manifest_data_names_the_key() -> None:
    with pytest.raises(GpunodeError, match="plugin_mig_strategy = 'half' is not accepted: expected one of none, "
                                           "single, mixed"):
        ManifestSettings.from_data({"plugin_mig_strategy": "half"})


def test_render_command_uses_the_inventory_data() -> None:
    result = subprocess.run([sys.executable, "-m", "gpunode.cli", "render", "inventories/prod.py"], cwd=REPO,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    docs = documents(result.stdout)
    assert docs[-1]["spec"]["template"]["spec"]["containers"][0]["image"] == "gpunode-device-plugin:0.1.0"
    assert docs[0]["metadata"]["name"] == "gpunode-system"


# -- diagnoses of the cluster steps -----------------------------------------------------------------------------


WANT = {"accelerator": "nvidia-a100", "nvidia.com/gpu.count": "4"}
IMAGE = ("registry.gpunode.test:5000/gpunode/device-plugin"
         "@sha256:387a7734c93b7216aadd26d8479ea5577ecb8caf1b76f58c142ee1bc1d6ddfe0")
RESOLVE = (f'failed to pull and unpack image "{IMAGE}": failed to resolve reference "{IMAGE}": ')
PULL_FAILURES = [
    ("ImagePullBackOff", RESOLVE + "pulling from host registry.gpunode.test:5000 failed with status code [manifests "
     "sha256:387a7734c93b7216aadd26d8479ea5577ecb8caf1b76f58c142ee1bc1d6ddfe0]: 401 Unauthorized",
     "plugin_registry_password"),
    ("ErrImagePull", 'rpc error: code = NotFound desc = failed to pull and unpack image "registry.gpunode.test:5000/'
     'gpunode/device-plugin:nope": failed to resolve reference "registry.gpunode.test:5000/gpunode/device-plugin:nope"'
     ': registry.gpunode.test:5000/gpunode/device-plugin:nope: not found', "gpunode image push"),
    ("ImagePullBackOff", RESOLVE + 'failed to do request: Head "https://registry.gpunode.test:5000/v2/gpunode/'
     'device-plugin/manifests/nope": x509: certificate signed by unknown authority',
     "/etc/containerd/certs.d/registry.gpunode.test:5000/"),
    ("ImagePullBackOff", RESOLVE + "pulling from host 127.0.9.252:5000 failed with status code [manifests nope]: "
     "400 Bad Request", "disagree about TLS"),
    ("ErrImagePull", 'Error response from daemon: Get "https://registry.gpunode.test:5000/v2/gpunode/device-plugin/'
     'manifests/sha256:387a": no basic auth credentials', "refused the nodes' credentials"),
    ("ErrImagePull", "dial tcp: lookup registry.gpunode.test: no such host", "cannot reach registry.gpunode.test:5000"),
]


def test_label_keys_come_from_fields_v1() -> None:
    assert label_keys({"f:metadata": {"f:labels": {".": {}, "f:a": {}, "f:b.io/c": {}}}}) == {"a", "b.io/c"}
    assert label_keys({"f:spec": {}}) == set() and label_keys(None) == set()


@pytest.mark.parametrize(("state", "codes", "applied"), [
    (NodeLabelsState("n", True, dict(WANT), frozenset(WANT)), [], WANT),
    (NodeLabelsState("n", False), ["node-missing"], None),
    (NodeLabelsState("n", True, {"accelerator": "nvidia-v100", "nvidia.com/gpu.count": "4"}, frozenset(WANT)),
     ["labels-stale"], WANT),
    (NodeLabelsState("n", True, {**WANT, "old": "x"}, frozenset({*WANT, "old"})), ["labels-stale"], WANT),
    (NodeLabelsState("n", True, {"accelerator": "mine", "nvidia.com/gpu.count": "4"},
                     frozenset({"nvidia.com/gpu.count"}), {"accelerator": "kubectl-label"}),
     ["label-foreign"], {"nvidia.com/gpu.count": "4"}),
    (NodeLabelsState("n", True, dict(WANT), frozenset({"nvidia.com/gpu.count"}), {"accelerator": "kubectl-label"}),
     [], WANT),  # same value: shared ownership, gpunode applies it too
])
def test_labels_diagnosis(state: NodeLabelsState, codes: list[str], applied: dict | None) -> None:
    findings = label_diagnosis.diagnose(state, WANT)
    assert [f.code for f in findings if f.state is not Verdict.OK] == codes
    proofs = [f for f in findings if f.state is Verdict.OK]
    if "labels-stale" in codes or "node-missing" in codes:
        assert proofs == []
    else:  # the proof quotes the labels as read from the Node
        assert [f"kubectl get node n: {k}={state.labels[k]}" for k in sorted(applied or WANT)] == proofs[0].evidence
    if applied is not None:
        assert label_diagnosis.plan(state, WANT)[0] == applied


def test_a_cpu_node_with_gpu_labels_is_named() -> None:
    state = NodeLabelsState("cpu1", True, {"nvidia.com/gpu.present": "true"}, frozenset({"nvidia.com/gpu.present"}))
    finding = label_diagnosis.diagnose(state, {})[0]
    assert finding.what == "cpu1 carries GPU labels but has no working GPU"


FOUR = expected_offer([{"index": i} for i in range(4)], "none", None)
ROLLED = RolloutState(True, 1, 1, 2, 2, 2, {"nvidia.com/gpu.present": "true"})
NODE = NodeLabelsState("n1", True, {"nvidia.com/gpu.present": "true"}, allocatable={"nvidia.com/gpu": "0"})
READY = PluginPodState("n1", "p-1", "Running", True)


@pytest.mark.parametrize(("rollout", "pod", "node", "code", "fix"), [
    (RolloutState(False), PluginPodState("n1"), NODE, "plugin-missing", "deploys/device_plugin.py"),
    (ROLLED, PluginPodState("n1"), NodeLabelsState("n1", True, {}), "plugin-not-scheduled", "deploys/labels.py"),
    (ROLLED, PluginPodState("n1"), NODE, "plugin-not-scheduled", "describe daemonset"),
    # a key another manager added to the DaemonSet's selector: the evidence shows the selector as read
    (RolloutState(True, 1, 1, 0, 0, 0, {"nvidia.com/gpu.present": "true", "pool": "batch"}), PluginPodState("n1"),
     NODE, "plugin-not-scheduled", "asks for pool=batch, which this node does not carry"),
    (ROLLED, PluginPodState("n1", "p-1", "Running", False, "CrashLoopBackOff", 3, 1), NODE, "plugin-crashloop",
     "logs p-1 --previous"),
    (ROLLED, PluginPodState("n1", "p-1", "Running", False), NODE, "plugin-not-ready", "logs p-1"),
    (ROLLED, READY, NODE, "gpus-unhealthy", "nvidia-smi -q"),
    # the real kubelet's words when the node's containerd has no handler for the pod's RuntimeClass
    (ROLLED, PluginPodState("n1", "p-1", "Pending", False, "ContainerCreating", warnings=(
        'FailedCreatePodSandBox: Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get '
        'sandbox runtime: no runtime for "nvidia" is configured',)), NODE, "plugin-sandbox-failed",
     "deploys/runtime.py"),
    (ROLLED, PluginPodState("n1", "p-1", "Pending", False, "ContainerCreating", warnings=(
        'FailedCreatePodSandBox: Failed to create pod sandbox: rpc error: failed to get sandbox image',)), NODE,
     "plugin-sandbox-failed", "describe pod p-1"),
    # the real kubelet's and containerd 1.6's words (the fleet's registry, a wrong password and a missing tag);
    # docker's for a pull without credentials (the docker nodes' agent quotes docker)
    *[(ROLLED, PluginPodState("n1", "p-1", "Pending", False, reason, image=IMAGE,
                              warnings=(f'Failed: Failed to pull image "{IMAGE}": {said}',)), NODE,
       "plugin-image-pull", fix) for reason, said, fix in PULL_FAILURES],
])
def test_device_plugin_diagnosis_names_the_first_broken_link(rollout: RolloutState, pod: PluginPodState,
                                                              node: NodeLabelsState, code: str, fix: str) -> None:
    findings = plugin_diagnosis.diagnose(rollout, pod, node, FOUR, "gpunode-system")
    assert [f.code for f in findings] == [code]
    assert "n1 offers 0 allocatable nvidia.com/gpu, its driver sees 4" in findings[0].what
    assert fix in findings[0].fix
    assert all(f"event {w}" in findings[0].evidence for w in pod.warnings)  # quoted as read


def test_device_plugin_selector_evidence_is_what_was_read() -> None:
    rollout = RolloutState(True, 1, 1, 0, 0, 0, {"nvidia.com/gpu.present": "true", "pool": "batch"})
    finding = plugin_diagnosis.diagnose(rollout, PluginPodState("n1"), NODE, FOUR, "ns")[0]
    assert "daemonset ns/gpunode-device-plugin nodeSelector: nvidia.com/gpu.present=true,pool=batch" in finding.evidence
    assert "node n1 label pool=<missing>" in finding.evidence
    assert "node n1 label nvidia.com/gpu.present=true" in finding.evidence


def test_device_plugin_proof_when_every_gpu_is_offered() -> None:
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "4"})
    findings = plugin_diagnosis.diagnose(ROLLED, READY, node, FOUR, "ns")
    assert [f.state for f in findings] == [Verdict.OK]
    assert "kubectl get node n1 -o jsonpath='{.status.allocatable}': nvidia.com/gpu=4" in findings[0].evidence
    assert "pod ns/p-1: Running, ready=true, restarts=0" in findings[0].evidence


@pytest.mark.parametrize(("pod", "waits"), [
    (PluginPodState("n1", "dra-2", "Running", True), False),  # its successor, ready
    (PluginPodState("n1", "dra-1", "Running", True), True),  # the pod the run replaced, still there
    (PluginPodState("n1", "dra-2", "Pending", False), True),
    (PluginPodState("n1"), True),  # none yet
])
def test_a_restarted_dra_driver_is_waited_for_until_its_successor_is_ready(pod: PluginPodState, waits: bool) -> None:
    found = plugin_diagnosis.dra_driver_replaced(pod, "dra-1", "ns")
    assert (found is not None) == waits
    if found is not None:
        assert (found.code, found.state) == ("dra-driver-not-ready", Verdict.FINDING)
        assert f"gpunode-dra-driver pod on n1: {pod.name or '<none>'}, ready={pod.ready}" in found.evidence
        assert "--field-selector spec.nodeName=n1" in found.fix


def test_time_slicing_is_not_blamed_on_xids() -> None:
    """Before: 16 allocatable on a 4-GPU node with 4 replicas read as 'some GPUs are marked unhealthy (Xid)'."""
    config = parse_plugin_config({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": 4}]}}})
    offer = expected_offer([{"index": i} for i in range(4)], "none", config)
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "16"})
    findings = plugin_diagnosis.diagnose(ROLLED, READY, node, offer, "ns")
    assert [f.state for f in findings] == [Verdict.OK] and "x 4 replicas" in " ".join(findings[0].evidence)
    assert [f.code for f in plugin_diagnosis.diagnose(ROLLED, READY, node, FOUR, "ns")] == ["offers-more"]


def test_a_node_offering_its_gpus_under_another_name_is_named() -> None:
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "16"})
    finding = plugin_diagnosis.diagnose(ROLLED, READY, node, FOUR, "ns")[0]
    assert finding.code == "resource-name-differs"
    assert "kubectl get node n1: allocatable nvidia.com/gpu.shared=16" in finding.evidence


def test_mig_makes_the_count_not_checked_instead_of_wrong() -> None:
    offer = expected_offer([{"index": 0, "mig_mode": "Enabled"}], "mixed", None)
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/mig-1g.5gb": "7"})
    findings = plugin_diagnosis.diagnose(ROLLED, READY, node, offer, "ns")
    assert [(f.state, f.code) for f in findings] == [(Verdict.NOT_CHECKED, "count-unknown")]
    assert "kubectl get node n1: allocatable nvidia.com/mig-1g.5gb=7" in findings[0].evidence


@pytest.mark.parametrize(("reason", "fix"), [("driver mismatch: reboot pending", "re-run the deploy"),
                                              ("", "kubectl uncordon n1 when its maintenance is over")])
def test_a_cordoned_gpu_node_is_a_finding_with_its_reason(reason: str, fix: str) -> None:
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "4"}, unschedulable=True,
                           cordon_reason=reason)
    findings = plugin_diagnosis.diagnose(ROLLED, READY, node, FOUR, "ns")
    assert [f.code for f in findings] == ["node-cordoned"]
    assert fix in findings[0].fix
    assert f"annotation gpunode.io/cordon-reason: {reason or 'absent (not cordoned by gpunode)'}" in \
        findings[0].evidence


def test_rollout_is_complete_only_when_desired_updated_and_ready_agree() -> None:
    assert ROLLED.complete
    assert not RolloutState(True, 2, 1, 2, 2, 2).complete  # the controller has not seen the new generation
    assert not RolloutState(True, 1, 1, 2, 1, 2).complete
    assert not RolloutState(False).complete


def test_more_than_expected_is_not_blamed_on_xids() -> None:
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "16"})
    finding = plugin_diagnosis.diagnose(ROLLED, READY, node, FOUR, "ns")[0]
    assert finding.code == "offers-more" and "plugin_config" in finding.fix


def test_a_count_the_kubelet_kept_after_its_plugin_went_away_is_no_proof() -> None:
    node = NodeLabelsState("n1", True, {"nvidia.com/gpu.present": "true"}, allocatable={"nvidia.com/gpu": "4"})
    finding = plugin_diagnosis.diagnose(ROLLED, PluginPodState("n1"), node, FOUR, "ns")[0]
    assert finding.code == "plugin-not-scheduled"
    assert finding.what.startswith("n1 still shows 4 allocatable nvidia.com/gpu, which the kubelet keeps a while")


def test_a_crash_looping_plugin_on_a_mig_node_is_never_not_checked() -> None:
    """Before: MIG on, no MIG device, strategy single: "not checked" (count unknown) while the plugin crash-looped."""
    offer = expected_offer([{"index": 0, "mig_mode": "Enabled"}, {"index": 1, "mig_mode": "Enabled"}], "single", None)
    assert offer.count is None
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "0"})
    said = "mig-strategy single: every MIG-enabled GPU needs at least one MIG device"
    pod = PluginPodState("n1", "p-1", "Running", False, "CrashLoopBackOff", 4, 1, (said,))
    findings = plugin_diagnosis.diagnose(ROLLED, pod, node, offer, "ns")
    assert [(f.state, f.code) for f in findings] == [(Verdict.FINDING, "plugin-crashloop")]
    assert f"log: {said}" in findings[0].evidence and "nvidia-smi mig -cgi" in findings[0].fix
    healthy = plugin_diagnosis.diagnose(ROLLED, READY, node, offer, "ns")
    assert [f.code for f in healthy] == ["count-unknown"]  # a ready plugin: the count alone is what is unknown


def test_a_gpu_the_plugin_marked_unhealthy_is_named_with_its_reason() -> None:
    """Before: "some GPUs unhealthy (Xid) or missing": neither the GPU nor the cause named."""
    from gpunode.facts.device_plugin import unhealthy_devices

    log = ['2026-12-03 06:50:01,002 WARNING gpunode_plugin.health: device GPU-1a of nvidia.com/gpu unhealthy: '
           'double-bit ECC error',
           '{"ts": "2026-12-03T06:50:02", "level": "WARNING", "logger": "gpunode_plugin.health", '
           '"msg": "device GPU-2b of nvidia.com/gpu unhealthy: Xid 79"}', "registered nvidia.com/gpu"]
    devices = unhealthy_devices(log)
    assert devices == (("GPU-1a", "nvidia.com/gpu", "double-bit ECC error"), ("GPU-2b", "nvidia.com/gpu", "Xid 79"))
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "2"})
    pod = PluginPodState("n1", "p-1", "Running", True, unhealthy=devices[:1])
    finding = plugin_diagnosis.diagnose(ROLLED, pod, node, FOUR, "ns")[0]
    assert finding.code == "gpus-unhealthy" and "GPU-1a (double-bit ECC error)" in finding.what
    assert "plugin log: device GPU-1a of nvidia.com/gpu unhealthy: double-bit ECC error" in finding.evidence
    assert "PAGE_RETIREMENT" in finding.fix


def test_a_plugin_waiting_for_a_kubelet_socket_that_never_comes_is_told_where_to_look() -> None:
    said = ("2026-12-03 06:50:01,002 WARNING gpunode_plugin.manager: kubelet socket "
            "/var/lib/kubelet/device-plugins/kubelet.sock not there yet: will register when it appears")
    pod = PluginPodState("n1", "p-1", "Running", False, log_tail=(said,))
    finding = plugin_diagnosis.diagnose(ROLLED, pod, NODE, FOUR, "ns")[0]
    assert finding.code == "plugin-not-ready" and f"log: {said}" in finding.evidence
    assert "hostPath must be the kubelet's device-plugins folder" in finding.fix


def test_mig_single_counts_the_mig_devices_nvidia_smi_lists() -> None:
    """Before: any MIG node was "not checked" (count unknown); under single the count is the MIG devices'."""
    gpus = [{"index": i, "mig_mode": "Enabled", "mig_devices": ["1g.5gb"] * 7} for i in range(2)]
    offer = expected_offer(gpus, "single", None)
    assert (offer.resource, offer.count) == ("nvidia.com/gpu", 14) and "14 MIG device(s)" in offer.basis
    node = NodeLabelsState("n1", True, {}, allocatable={"nvidia.com/gpu": "14"})
    assert [f.state for f in plugin_diagnosis.diagnose(ROLLED, READY, node, offer, "ns")] == [Verdict.OK]
    assert expected_offer(gpus, "mixed", None).count is None  # one count cannot hold several profiles
    assert expected_offer([{k: v for k, v in g.items() if k != "mig_devices"} for g in gpus], "single",
                          None).count is None  # not listed: unknown, never guessed


def test_a_failing_plugin_link_quotes_the_nodes_own_warning_events() -> None:
    """The last distinct Warning events about each Node (one list), added to the failing findings only."""
    from lightkube.models.core_v1 import EventSource, ObjectReference
    from lightkube.models.meta_v1 import ObjectMeta
    from lightkube.resources.core_v1 import Event

    from gpunode.facts.node_events import node_warnings

    def event(node: str, reason: str, message: str, second: int, kind: str = "Node", type_: str = "Warning") -> Event:
        return Event(metadata=ObjectMeta(name=f"{node}.{second}"), involvedObject=ObjectReference(kind=kind, name=node),
                     reason=reason, message=message, type=type_, source=EventSource(component="kubelet"),
                     lastTimestamp=datetime(2026, 12, 3, 12, 0, second, tzinfo=UTC))

    # the kubelet v1.35's own words on a cgroup v1 host (as read on this machine's fleet) and after a reboot
    cgroup = ("cgroup v1 detected. cgroup v1 support is deprecated and will be removed in a future release. Please "
              "migrate to cgroup v2. More information at "
              "https://git.k8s.io/enhancements/keps/sig-node/5573-remove-cgroup-v1")
    warnings = node_warnings([
        event("node01", "CgroupV1", cgroup, 1), event("node01", "CgroupV1", cgroup, 2),
        event("node01", "Rebooted", "Node node01 has been rebooted, boot id: 7c1e", 3),
        event("node01", "Started", "Started container", 4, type_="Normal"),
        event("node01", "BackOff", "Back-off restarting failed container", 5, kind="Pod"),
        event("node02", "SystemOOM", "System OOM encountered, victim process: python3, pid: 4242", 6)])
    assert warnings == {"node01": (f"kubelet: CgroupV1: {cgroup}",
                                   "kubelet: Rebooted: Node node01 has been rebooted, boot id: 7c1e"),
                        "node02": ("kubelet: SystemOOM: System OOM encountered, victim process: python3, pid: 4242",)}
    ok = plugin_diagnosis.proven("device_plugin", "node01 offers its 8 nvidia.com/gpu", ["count"])
    failed = plugin_diagnosis.Finding("device_plugin", Verdict.FINDING, "node01 offers 0", ["count"], "fix", "x")
    quoted = plugin_diagnosis.with_node_warnings([failed, ok], "node01", warnings["node01"])
    assert quoted[0].evidence == ["count", f"Warning event on node node01 (kubelet: CgroupV1: {cgroup})",
                                  "Warning event on node node01 (kubelet: Rebooted: Node node01 has been rebooted, "
                                  "boot id: 7c1e)"]
    assert quoted[1] is ok
    assert plugin_diagnosis.with_node_warnings([failed], "node03", ()) == [failed]


@pytest.mark.parametrize(("replicas", "modes", "named"), [
    (2, ["Exclusive_Process", "Default"], "GPU(s) 0 take only one CUDA context at a time"),
    (4, ["Exclusive_Thread", "Exclusive_Process"], "GPU(s) 0 1 take only one CUDA context"),
    (2, ["Default", "Default"], None),
    (None, ["Exclusive_Process", "Default"], None),  # no time-slicing: exclusive mode is the admin's choice
])
def test_time_slicing_on_a_gpu_in_exclusive_compute_mode_is_named(replicas: int | None, modes: list[str],
                                                                  named: str | None) -> None:
    config = parse_plugin_config({"version": "v1", "sharing": {"timeSlicing": {"resources": [
        {"name": "nvidia.com/gpu", "replicas": replicas}]}}}) if replicas else None
    health = [{"index": n, "ecc_uncorrected": 0, "retired_pending": None, "compute_mode": mode}
              for n, mode in enumerate(modes)]
    found = plugin_diagnosis.exclusive_time_slicing("node01", health, config)
    if named is None:
        assert found is None
        return
    assert found is not None and found.code == "exclusive-time-sliced" and named in found.what
    assert f"nvidia-smi compute_mode: GPU 0 {modes[0]}" in found.evidence
    assert found.fix.startswith("nvidia-smi -i 0 -c DEFAULT on node01")
