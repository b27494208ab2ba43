"""Data-driven: why a GPU pod is Pending, cannot start or runs without a GPU (gpunode.diagnosis.pods)."""

from __future__ import annotations

import pytest

from gpunode.diagnosis.pods import NodeView, PodView, diagnose, holders

GPU_SPEC = {"nodeName": "n1", "runtimeClassName": "nvidia",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}
NODES = [NodeView("n1", {"accelerator": "nvidia-a100"}, 4, False), NodeView("n2", {"accelerator": "nvidia-v100"}, 2,
                                                                            True), NodeView("cpu", {}, 0)]
RUNNING = [("ml", "trainer", "Running", {**GPU_SPEC, "nodeName": "n1"}),
           ("ml", "done", "Succeeded", {**GPU_SPEC, "nodeName": "n1"})]
INSUFFICIENT = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
NO_MATCH = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


def pod(**changes: object) -> PodView:
    base = {"namespace": "ml", "name": "p", "phase": "Running", "spec": dict(GPU_SPEC)}
    return PodView(**{**base, **changes})


@pytest.mark.parametrize(("view", "code", "phrase"), [
    (pod(phase="Pending", spec={**GPU_SPEC, "nodeName": None}, events=[("FailedScheduling", INSUFFICIENT)]),
     "insufficient-gpus", "n1: 4 allocatable, held by ml/trainer (2)"),
    (pod(phase="Pending", spec={**GPU_SPEC, "nodeSelector": {"accelerator": "nvidia-h100"}},
         events=[("FailedScheduling", NO_MATCH)]),
     "selector-no-gpu-node", "accelerator=nvidia-a100"),
    (pod(phase="Pending", events=[("FailedCreatePodSandBox", 'no runtime for "nvidia" is configured')]),
     "runtime-handler-missing", 'no runtime for "nvidia" is configured'),
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


def test_no_runtime_class_is_fine_where_nvidia_is_the_default() -> None:
    view = pod(phase="Failed", spec={**GPU_SPEC, "nodeName": "n2", "runtimeClassName": None},
               log="CUDA_ERROR_NO_DEVICE")
    assert [f.code for f in diagnose(view, NODES, RUNNING)] == ["runtime-no-injection"]


def test_a_healthy_pod_has_no_finding() -> None:
    assert diagnose(pod(phase="Succeeded", log="CUDA devices: 2\n"), NODES, RUNNING) == []


def test_finished_pods_hold_no_gpus() -> None:
    assert holders(RUNNING) == {"n1": ["ml/trainer (2)"]}
