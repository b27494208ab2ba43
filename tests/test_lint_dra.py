"""gpunode lint on Dynamic Resource Allocation references: the API server's words where it refuses, a warning where
a name the manifests do not define leaves the pod Pending."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.lint import lint_targets, lint_text

TEMPLATE = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: single-gpu}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.gpunode.io, count: COUNT}
"""
DEVICE_CLASS = """\
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.gpunode.io}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.gpunode.io"'}
"""
POD = """\
apiVersion: v1
kind: Pod
metadata: {name: trainer}
spec:
  resourceClaims:
  - name: gpu
    SOURCE
  containers:
  - name: main
    image: cuda
    resources:
      claims:
      - name: USED
"""


def pod(source: str = "resourceClaimTemplateName: single-gpu", used: str = "gpu") -> str:
    return POD.replace("SOURCE", source).replace("USED", used)


def template(count: int = 1) -> str:
    return TEMPLATE.replace("COUNT", str(count))


# (level, the document it is in, the line in that document, words of the finding)
@pytest.mark.parametrize(("documents", "expected"), [
    # all defined, all named: nothing to say
    ([DEVICE_CLASS, template(), pod()], []),
    ([DEVICE_CLASS, template(2), pod()], []),
    # the API server's words (pkg/apis/core/validation: validateResourceClaimNames, validatePodResourceClaimSource)
    ([DEVICE_CLASS, template(), pod(used="gpus")],
     [("error", 2, 13, 'spec.containers[0].resources.claims[0]: Not found: "gpus": must be one of the names in '
                       "pod.spec.resourceClaims: gpu")]),
    ([DEVICE_CLASS, template(), pod(source="")],
     [("error", 2, 6, "spec.resourceClaims[0]: Invalid value: 'gpu': must specify one of: `resourceClaimName`, "
                      "`resourceClaimTemplateName`")]),
    ([DEVICE_CLASS, template(), pod(source="resourceClaimName: shared\n    resourceClaimTemplateName: single-gpu")],
     [("error", 2, 6, "at most one of `resourceClaimName` or `resourceClaimTemplateName` may be specified")]),
    # pkg/apis/resource/validation: validateDeviceAllocationMode
    ([DEVICE_CLASS, template(-1), pod()],
     [("error", 1, 9, "spec.spec.devices.requests[0].exactly.count: Invalid value: -1: must be greater than zero")]),
    # accepted by the API server, Pending for ever: warnings
    ([template(), pod()], [("warning", 0, 9, "asks for devices of the DeviceClass 'gpu.gpunode.io', which these "
                                             "manifests do not define")]),
    ([DEVICE_CLASS, pod()], [("warning", 1, 7, "names the ResourceClaimTemplate 'single-gpu', which these manifests "
                                               "do not define")]),
    ([DEVICE_CLASS, pod(source="resourceClaimName: shared")],
     [("warning", 1, 7, "names the ResourceClaim 'shared', which these manifests do not define")]),
])
def test_dra_references(documents: list[str], expected: list[tuple[str, int, int, str]]) -> None:
    starts = [1]
    for text in documents:
        starts.append(starts[-1] + text.count("\n") + 1)  # each document and its "---" line
    findings = lint_text("---\n".join(documents), "m.yaml")
    assert [(f.level, f.line) for f in findings] == [(level, starts[doc] + line - 1)
                                                     for level, doc, line, _ in expected], findings
    for finding, (_, _, _, words) in zip(findings, expected, strict=True):
        assert words in finding.what, finding.what


def test_references_are_checked_across_the_files_of_one_run(tmp_path: Path) -> None:
    """A template in one file serves a pod in another; a v1beta1 request names its class directly."""
    (tmp_path / "class.yaml").write_text(DEVICE_CLASS)
    (tmp_path / "claims.yaml").write_text(template().replace("exactly: {deviceClassName: gpu.gpunode.io, count: 1}",
                                                             "deviceClassName: gpu.gpunode.io"))
    (tmp_path / "pod.yaml").write_text(pod())
    findings, unreadable = lint_targets([str(tmp_path)])
    assert (findings, unreadable) == ([], [])
    (tmp_path / "class.yaml").unlink()
    findings, _ = lint_targets([str(tmp_path)])
    assert [(Path(f.source).name, f.level) for f in findings] == [("claims.yaml", "warning")]
    assert "DeviceClass 'gpu.gpunode.io'" in findings[0].what


def device_class(expression: str) -> str:
    return DEVICE_CLASS.replace("""'device.driver == "gpu.gpunode.io"'""", json.dumps(expression))


GPUNODE = "device.attributes['gpu.gpunode.io']"


@pytest.mark.parametrize(("expression", "words"), [
    # what the driver publishes, read as DRA's documentation writes it: nothing to say
    (f"{GPUNODE}.productName == 'NVIDIA A100-SXM4-80GB' && {GPUNODE}.driverVersion.isGreaterThan(semver('550.0.0'))",
     None),
    (f"{GPUNODE}['cudaComputeCapability'] == semver('8.0.0')", None),
    ("device.capacity['gpu.gpunode.io'].memory.compareTo(quantity('40Gi')) >= 0", None),
    ("device.attributes['gpu.nvidia.com'].productname == 'x'", None),  # another driver's: its own names
    # a misspelt attribute or capacity matches no device
    (f"{GPUNODE}.productname == 'NVIDIA A100-SXM4-80GB'", "reads device.attributes['gpu.gpunode.io'].productname"),
    ('device.attributes["gpu.gpunode.io"].model == "A100"', "gpunode's DRA driver does not publish"),
    ("device.capacity['gpu.gpunode.io'].mem.compareTo(quantity('40Gi')) >= 0", "capacity['gpu.gpunode.io'].mem"),
    # a version is not a string
    (f"{GPUNODE}.driverVersion >= '550.0.0'", "compares device.attributes['gpu.gpunode.io'].driverVersion"),
])
def test_a_selector_is_read_against_what_the_driver_publishes(expression: str, words: str | None) -> None:
    findings = lint_text(device_class(expression), "class.yaml")
    assert [f.level for f in findings] == ([] if words is None else ["warning"]), findings
    if words is not None:
        assert words in findings[0].what and findings[0].line == 6, findings[0]
        assert "semver(" in findings[0].fix or "the driver publishes the" in findings[0].fix


def test_a_misspelt_attribute_gets_the_name_it_resembles_and_a_requests_selectors_are_read_too() -> None:
    request = template().replace("exactly: {deviceClassName: gpu.gpunode.io, count: 1}", "exactly:\n"
                                 "          deviceClassName: gpu.gpunode.io\n          selectors:\n"
                                 f"          - cel: {{expression: \"{GPUNODE}.pciBusId == '0000:07:00.0'\"}}")
    findings = lint_text("---\n".join([DEVICE_CLASS, request]), "m.yaml")
    assert [f.level for f in findings] == ["warning"], findings
    assert findings[0].fix.startswith("did you mean pciBusID?"), findings[0].fix
    assert "ResourceClaimTemplate 'single-gpu'" in findings[0].what


def test_the_attributes_lint_knows_are_the_ones_the_driver_publishes() -> None:
    from gpunode_plugin.backend import Gpu, MigDevice
    from gpunode_plugin.dra_devices import devices

    from gpunode.lint_dra import ATTRIBUTES, CAPACITIES

    whole = Gpu(index=0, uuid="GPU-a", name="NVIDIA A100-SXM4-80GB", memory_mib=81920, minor=0,
                pci_bus_id="00000000:07:00.0", compute_capability="8.0", driver_version="550.54.15",
                cuda_version="12.4")
    migged = Gpu(index=1, uuid="GPU-b", name="NVIDIA A100-SXM4-80GB", memory_mib=81920, minor=1,
                 pci_bus_id="00000000:0F:00.0", mig_enabled=True, compute_capability="8.0",
                 driver_version="550.54.15", cuda_version="12.4",
                 mig_devices=(MigDevice("MIG-b0", "3g.40gb", "1:0", 1, 0),))
    published = devices([whole, migged])
    types = {name: next(iter(value)) for device in published for name, value in device["attributes"].items()}
    assert types == ATTRIBUTES
    assert {name for device in published for name in device.get("capacity", {})} == set(CAPACITIES)
