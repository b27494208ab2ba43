"""Data-driven: why a GPU pod is Pending, cannot start or runs without a GPU (gpunode.diagnosis.pods)."""

from __future__ import annotations

import pytest

from gpunode.diagnosis import Verdict, failures
from gpunode.diagnosis.pods import ContainerView, NodeView, PodView, diagnose, holders

GPU_SPEC = {"nodeName": "n1", "runtimeClassName": "nvidia",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
NODES = [NodeView("n1", {"accelerator": "nvidia-a100"}, 4, False), NodeView("n2", {"accelerator": "nvidia-v100"}, 2,
                                                                            True), NodeView("cpu", {}, 0)]
RUNNING = [("ml", "trainer", "Running", {**GPU_SPEC, "nodeName": "n1"}),
           ("ml", "done", "Succeeded", {**GPU_SPEC, "nodeName": "n1"})]
INSUFFICIENT = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
NO_MATCH = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."
CDI_STAT = ("failed to create containerd container: CDI device injection failed: failed to inject devices: failed to "
            'stat CDI host device "/dev/nvidia-uvm": no such file or directory')


def pod(**changes: object) -> PodView:
    base = {"namespace": "ml", "name": "p", "phase": "Running", "spec": dict(GPU_SPEC)}
    return PodView(**{**base, **changes})


@pytest.mark.parametrize(("view", "code", "phrase"), [
    (pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None}, events=[("FailedScheduling", INSUFFICIENT)]),
     "insufficient-gpus", "n1: 4 allocatable, held by ml/trainer (2)"),
    (pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None, "nodeSelector": {"accelerator": "nvidia-h100"}},
         events=[("FailedScheduling", NO_MATCH)]),
     "selector-no-gpu-node", "accelerator=nvidia-a100"),
    (pod(phase="Pending", events=[("FailedCreatePodSandBox", 'no runtime for "nvidia" is configured')]),
     "runtime-handler-missing", 'no runtime for "nvidia" is configured'),
    # bound to n1 after an earlier FailedScheduling (its GPUs were not back yet): the scheduler's word is history,
    # the runtime's is what holds it (containerd 1.7.24 over a spec naming a device node the node lost)
    (pod(phase="Pending", events=[("FailedScheduling", INSUFFICIENT), ("Scheduled", "assigned ml/p to n1"),
                                  ("Failed", CDI_STAT)],
         containers=(ContainerView("c", "waiting", "CreateContainerError", CDI_STAT),)),
     "cdi-device-node-missing", '"/dev/nvidia-uvm": no such file or directory'),
    (pod(phase="Failed", spec={**GPU_SPEC, "runtimeClassName": None}, log="CUDA_ERROR_NO_DEVICE\n"),
     "no-runtime-class", "n1: default runtime is not nvidia"),
    (pod(phase="Failed", spec={"nodeName": "n1", "containers": [{"name": "c"}]}, log="CUDA_ERROR_NO_DEVICE"),
     "no-gpu-request", "CUDA_ERROR_NO_DEVICE"),
    (pod(phase="Failed", log="x CUDA_ERROR_NO_DEVICE"), "runtime-no-injection", "CUDA_ERROR_NO_DEVICE"),
])
def test_pod_diagnosis(view: PodView, code: str, phrase: str) -> None:
    findings = diagnose(view, NODES, RUNNING)
    assert [f.code for f in findings] == [code]
    assert phrase in " ".join(findings[0].evidence), findings[0].evidence
    assert findings[0].fix


def test_a_plugin_node_offering_no_gpu_now_is_named_where_a_pod_waits_for_gpus() -> None:
    """Before: the node whose device plugin offered nothing (a non-executable runtime stops the plugin's own pod)
    was left out of the evidence ("a node missing from the list offers no GPUs")."""
    served = NodeView("n3", {"accelerator": "nvidia-a100", "gpunode.io/device-plugin": "true"}, 0)
    view = pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None}, events=[("FailedScheduling", INSUFFICIENT)])
    [finding] = diagnose(view, [*NODES, served], RUNNING)
    assert finding.code == "insufficient-gpus"
    assert "n3: 0 allocatable, though gpunode's device plugin is to serve it (label gpunode.io/device-plugin=true)" \
        in finding.evidence
    assert finding.fix.startswith("'gpunode doctor --limit n3' names why n3 offer(s) no GPU now; ")
    [plain] = diagnose(view, NODES, RUNNING)  # no such node: the fix as before
    assert plain.fix.startswith("wait for or delete the pods holding GPUs above")


def test_no_runtime_class_is_fine_where_nvidia_is_the_default() -> None:
    view = pod(phase="Failed", spec={**GPU_SPEC, "nodeName": "n2", "runtimeClassName": None},
               log="CUDA_ERROR_NO_DEVICE")
    assert [f.code for f in diagnose(view, NODES, RUNNING)] == ["runtime-no-injection"]


DONE = (ContainerView("c", "terminated", "Completed", exit_code=0),)
LISTED = ("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-6b0ba8e2-6c9e-4b4e-b1c4-2f7e52e5f1a1)\n"
          "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0d6a2e3c-8f1b-4a57-9a43-3c1e1f0b7a22)\n")


def test_a_healthy_gpu_pod_is_ok_only_with_proof_of_each_link() -> None:
    findings = diagnose(pod(phase="Succeeded", log=LISTED, containers=DONE), NODES, RUNNING)
    assert [(f.step, f.state) for f in findings] == [("pod", Verdict.OK), ("pod GPUs", Verdict.OK)]
    assert "container c: terminated (Completed), exit code 0, ready=false, restarts=0" in findings[0].evidence
    assert f"container output: {LISTED.splitlines()[1]}" in findings[1].evidence


# each of these was called "ok: scheduled, started, and its container saw its GPUs" before (no pattern matched)
@pytest.mark.parametrize(("view", "code", "phrase"), [
    (pod(phase="Failed", containers=(ContainerView("c", "terminated", "Error", exit_code=3),), log="bad input\n"),
     "pod-failed", "container c: terminated (Error), exit code 3"),
    (pod(phase="Failed", reason="UnexpectedAdmissionError", message="Pod was rejected: Allocate failed due to "
         "requested number of devices unavailable for nvidia.com/gpu. Requested: 8, Available: 4, which is unexpected"),
     "admission-refused", "reason UnexpectedAdmissionError: Pod was rejected: Allocate failed"),
    (pod(phase="Running", containers=(ContainerView("c", "waiting", "CrashLoopBackOff", restarts=4),)),
     "container-not-running", "container c: waiting (CrashLoopBackOff)"),
    (pod(phase="Pending", containers=(ContainerView("c", "waiting", "ContainerCreating"),),
         events=[("FailedCreatePodSandBox", "failed to create shim task: fork/exec "
                  "/usr/bin/nvidia-container-runtime: no such file or directory")]),
     "sandbox-failed", "/usr/bin/nvidia-container-runtime: no such file or directory"),
    (pod(phase="Succeeded", containers=DONE, log=LISTED.splitlines()[0] + "\n"), "gpu-count-mismatch",
     "resources.limits nvidia.com/gpu: 2"),
    (pod(phase="Succeeded", containers=()), "pod-state-odd", "pod status: phase Succeeded"),
    (pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None},
         events=[("FailedScheduling", "0/3 nodes are available: 1 node(s) were unschedulable, 2 Insufficient "
                  "nvidia.com/gpu.")]),
     "nodes-cordoned", "n2: spec.unschedulable = true, cordon reason: driver mismatch"),
])
def test_a_pod_is_not_ok_without_proof(view: PodView, code: str, phrase: str) -> None:
    nodes = [NODES[0], NodeView("n2", {}, 2, True, unschedulable=True, cordon_reason="driver mismatch"), NODES[2]]
    findings = failures(diagnose(view, nodes, RUNNING))
    assert [f.code for f in findings] == [code]
    assert any(phrase in line for line in findings[0].evidence), findings[0].evidence


def test_whether_the_container_saw_its_gpus_is_not_checked_without_its_output() -> None:
    findings = diagnose(pod(phase="Running", containers=(ContainerView("c", "running", ready=True),), log="hi\n"),
                        NODES, RUNNING)
    assert [(f.state, f.code) for f in findings] == [(Verdict.OK, "ok"), (Verdict.NOT_CHECKED, "gpus-not-shown")]
    assert "nvidia-smi -L" in findings[1].fix


def test_finished_pods_hold_no_gpus() -> None:
    assert holders(RUNNING) == {"n1": ["ml/trainer (2)"]}


# the 1.37 scheduler's words (pkg/scheduler/framework/plugins/tainttoleration: "node(s) had untolerated taint(s)")
TAINTED = ("0/3 nodes are available: 2 node(s) had untolerated taint(s), 1 Insufficient nvidia.com/gpu. preemption: "
           "0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
DEDICATED = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}


def tainted_nodes() -> list[NodeView]:
    return [NodeView("n1", {"accelerator": "nvidia-a100"}, 4, taints=(DEDICATED,)),
            NodeView("n2", {"accelerator": "nvidia-v100"}, 2, taints=(DEDICATED,)), NodeView("cpu", {}, 0)]


def test_every_part_of_the_scheduler_s_message_is_read() -> None:
    from gpunode.diagnosis.pods import scheduling_reasons

    assert scheduling_reasons(TAINTED) == [(2, "node(s) had untolerated taint(s)"), (1, "Insufficient nvidia.com/gpu")]
    assert scheduling_reasons(NO_MATCH) == [(3, "node(s) didn't match Pod's node affinity/selector")]
    assert scheduling_reasons("something else") == []


def test_tainted_gpu_nodes_lead_and_the_toleration_is_named() -> None:
    view = pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None}, events=[("FailedScheduling", TAINTED)])
    findings = diagnose(view, tainted_nodes(), [])
    assert [f.code for f in findings] == ["untolerated-taint"]
    assert "all of the GPU nodes it could use carry a taint it does not tolerate (n1, n2)" in findings[0].what
    assert "n1: taints dedicated=ml:NoSchedule, not tolerated by the pod" in findings[0].evidence
    assert "scheduler: 1 Insufficient nvidia.com/gpu" in findings[0].evidence
    assert findings[0].fix.startswith("add the toleration {key: dedicated, operator: Equal, value: ml, effect: "
                                      "NoSchedule} to the pod spec")


@pytest.mark.parametrize("toleration", [
    {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
    {"key": "dedicated", "operator": "Exists"},
    {"operator": "Exists"},
])
def test_a_tolerated_taint_is_not_blamed(toleration: dict) -> None:
    spec = {**GPU_SPEC, "nodeName": None, "tolerations": [toleration]}
    view = pod(phase="Pending", spec=spec, events=[("FailedScheduling", INSUFFICIENT)])
    assert [f.code for f in diagnose(view, tainted_nodes(), [])] == ["insufficient-gpus"]


def test_a_toleration_for_another_value_does_not_count() -> None:
    spec = {**GPU_SPEC, "nodeName": None,
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}]}
    view = pod(phase="Pending", spec=spec, events=[("FailedScheduling", TAINTED)])
    assert [f.code for f in diagnose(view, tainted_nodes(), [])] == ["untolerated-taint"]


# each a real component's words, as real users reported them (the runtime's through containerd's StartError)
LDCACHE = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
           "failed: unable to start container process: error during container init: error running hook #0: error "
           "running hook: exit status 1, stdout: , stderr: nvidia-container-cli: ldcache error: open failed: "
           "/sbin/ldconfig.real: no such file or directory: unknown")
REQUIRE = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
           "failed: unable to start container process: error during container init: error running hook #0: error "
           "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
           "requirement error: unsatisfied condition: cuda>=12.4, please update your driver to a newer version, or "
           "use an earlier cuda container: unknown")

# NVIDIA's nvidia-container-toolkit issue 108 (k3s, volume-mounts strategy) and issue 632 (docker, a device index)
HOOK = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
        "failed: unable to start container process: error during container init: error running hook #0: error "
        "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n")
VOLUME_MOUNTS = HOOK + "nvidia-container-cli: device error: /var/run/nvidia-container-devices: unknown device: unknown"
UNKNOWN_INDEX = HOOK + "nvidia-container-cli: device error: 2: unknown device: unknown"


# the 1.35 kubelet's event for a claim whose driver is gone (pkg/kubelet/kuberuntime and pkg/kubelet/cm/dra)
NOT_PREPARED = ("Failed to prepare dynamic resources: prepare dynamic resources: DRA driver gpu.gpunode.io is not "
                "registered")


@pytest.mark.parametrize(("view", "code", "phrase"), [
    (pod(phase="Pending", containers=(ContainerView("c", "waiting", "ContainerCreating", "", None),),
         events=[("FailedPrepareDynamicResources", NOT_PREPARED)]), "claim-prepare-failed",
     "event FailedPrepareDynamicResources: Failed to prepare dynamic resources"),
    (pod(phase="Failed", containers=(ContainerView("c", "terminated", "StartError", VOLUME_MOUNTS, 128),)),
     "volume-mounts-refused", "device error: /var/run/nvidia-container-devices: unknown device"),
    (pod(phase="Failed", containers=(ContainerView("c", "terminated", "StartError", UNKNOWN_INDEX, 128),)),
     "device-unknown-to-driver", "device error: 2: unknown device"),
    (pod(phase="Failed", containers=(ContainerView("c", "terminated", "StartError", LDCACHE, 128),)),
     "hook-ldconfig-failed", "container c terminated: failed to create containerd task"),
    (pod(phase="Running", containers=(ContainerView("c", "waiting", "CrashLoopBackOff", "", None),),
         events=[("Failed", "Error: " + REQUIRE)]), "driver-too-old-for-image", "unsatisfied condition: cuda>=12.4"),
    (pod(phase="Failed", log="RuntimeError: CUDA driver version is insufficient for CUDA runtime version\n"),
     "driver-too-old-for-image", "container output: RuntimeError: CUDA driver version is insufficient"),
    (pod(phase="Failed", log="Failed to initialize NVML: Insufficient Permissions\n"), "device-permissions",
     "container output: Failed to initialize NVML: Insufficient Permissions"),
    (pod(phase="Failed", log="cudaGetDeviceCount: no CUDA-capable device is detected\n"), "runtime-no-injection",
     "no CUDA-capable device is detected"),
    # a second context on a GPU in Exclusive_Process mode, as PyTorch and CuPy print cudaErrorDevicesUnavailable
    (pod(phase="Failed", log="RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable\n"),
     "gpu-busy-or-unavailable", "container output: RuntimeError: CUDA error: CUDA-capable device(s) is/are busy"),
])
def test_a_failed_gpu_container_is_linked_to_the_node_fact_by_its_own_words(view: PodView, code: str,
                                                                          phrase: str) -> None:
    findings = diagnose(view, NODES, RUNNING)
    assert [f.code for f in findings] == [code]
    assert phrase in " ".join(findings[0].evidence), findings[0].evidence
    assert "n1" in findings[0].fix or "n1" in findings[0].what
