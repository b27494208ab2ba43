"""The NVML backend's mapping from nvidia-ml-py calls to GPUs and health events, on a fake pynvml.

No GPU here: the fake answers the calls the backend makes the way nvidia-ml-py 13.x does
(names, error classes, event data), so the mapping code runs for real.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
from gpunode_plugin.backend import InitError
from gpunode_plugin.nvml_backend import NvmlBackend


def fake_pynvml(init_error: str | None = None, events: list | None = None) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    for name in ("LibraryNotFound", "DriverNotLoaded", "NotFound", "InvalidArgument", "Timeout", "NotSupported",
                 "GpuIsLost", "Unknown"):
        setattr(m, f"NVMLError_{name}", type(f"NVMLError_{name}", (NVMLError,), {}))
    m.NVMLError = NVMLError
    m.NVML_DEVICE_MIG_ENABLE = 1
    m.NVML_FEATURE_ENABLED = 1
    m.NVML_NVLINK_MAX_LINKS = 4
    m.nvmlEventTypeXidCriticalError = 0x8
    m.nvmlEventTypeDoubleBitEccError = 0x2
    gpus = [
        {"uuid": "GPU-aaa", "name": "NVIDIA A100-SXM4-80GB", "bus": "00000000:07:00.0", "minor": 0, "mig": 0,
         "links": {0: "00000000:0F:00.0"}},
        {"uuid": "GPU-bbb", "name": "NVIDIA A100-SXM4-80GB", "bus": "00000000:0F:00.0", "minor": 1, "mig": 1,
         "links": {0: "00000000:07:00.0"}},
    ]
    migs = {1: [{"uuid": "MIG-b0", "g": 3, "c": 3, "mem": 40192, "gi": 1, "ci": 0},
                {"uuid": "MIG-b1", "g": 2, "c": 1, "mem": 20096, "gi": 2, "ci": 0}]}
    queue = list(events or [])

    def init() -> None:
        if init_error:
            raise getattr(m, f"NVMLError_{init_error}")(init_error)

    m.nvmlInit = init
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    m.nvmlDeviceGetHandleByPciBusId = lambda bus: ("gpu", next(i for i, g in enumerate(gpus) if g["bus"] == bus))
    m.nvmlDeviceGetUUID = lambda h: gpus[h[1]]["uuid"] if h[0] == "gpu" else migs[h[1]][h[2]]["uuid"]
    m.nvmlDeviceGetName = lambda h: gpus[h[1]]["name"]
    m.nvmlDeviceGetPciInfo = lambda h: SimpleNamespace(busId=gpus[h[1]]["bus"].encode())
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(total=81920 * 1024 * 1024)
    m.nvmlDeviceGetMinorNumber = lambda h: gpus[h[1]]["minor"]
    m.nvmlDeviceGetCudaComputeCapability = lambda h: (8, 0)
    m.nvmlSystemGetDriverVersion = lambda: "550.54.15"
    m.nvmlSystemGetCudaDriverVersion = lambda: 12040

    def mig_mode(h: tuple) -> list[int]:
        return [gpus[h[1]]["mig"], gpus[h[1]]["mig"]]

    m.nvmlDeviceGetMigMode = mig_mode
    m.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_handle(h: tuple, j: int) -> tuple:
        if j >= len(migs.get(h[1], [])):
            raise m.NVMLError_NotFound("not found")
        return ("mig", h[1], j)

    m.nvmlDeviceGetMigDeviceHandleByIndex = mig_handle
    m.nvmlDeviceGetAttributes = lambda h: SimpleNamespace(
        gpuInstanceSliceCount=migs[h[1]][h[2]]["g"], computeInstanceSliceCount=migs[h[1]][h[2]]["c"],
        memorySizeMB=migs[h[1]][h[2]]["mem"])
    m.nvmlDeviceGetGpuInstanceId = lambda h: migs[h[1]][h[2]]["gi"]
    m.nvmlDeviceGetComputeInstanceId = lambda h: migs[h[1]][h[2]]["ci"]

    def link_state(h: tuple, link: int) -> int:
        if link not in gpus[h[1]]["links"]:
            raise m.NVMLError_NotSupported("no link")
        return 1

    m.nvmlDeviceGetNvLinkState = link_state
    m.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: SimpleNamespace(busId=gpus[h[1]]["links"][link])
    m.nvmlEventSetCreate = lambda: "set"
    m.nvmlEventSetFree = lambda s: None
    m.nvmlDeviceGetSupportedEventTypes = lambda h: 0xFF
    m.nvmlDeviceRegisterEvents = lambda h, mask, s: None

    def wait(s: str, ms: int) -> SimpleNamespace:
        if not queue:
            raise m.NVMLError_Timeout("timeout")
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        return item

    m.nvmlEventSetWait = wait
    return m


def test_gpus_mig_and_nvlink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    backend = NvmlBackend()
    backend.start()
    gpus = backend.gpus()
    assert [(g.uuid, g.minor, g.pci_bus_id, g.memory_mib, g.mig_enabled) for g in gpus] == [
        ("GPU-aaa", 0, "00000000:07:00.0", 81920, False), ("GPU-bbb", 1, "00000000:0F:00.0", 81920, True)]
    assert gpus[0].nvlink_peers == ("GPU-bbb",) and gpus[1].nvlink_peers == ("GPU-aaa",)
    # what a DRA ResourceSlice says of each GPU: compute capability, the driver's version and its CUDA (12040)
    assert (gpus[0].compute_capability, gpus[0].driver_version, gpus[0].cuda_version) == ("8.0", "550.54.15", "12.4")
    # only GI-level profiles (C == G) are exposed, as NVIDIA's plugin does
    assert [(d.uuid, d.profile, d.index) for d in gpus[1].mig_devices] == [("MIG-b0", "3g.39gb", "1:0")]


def test_events(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml(events=[SimpleNamespace(device=("gpu", 1), eventType=0x8, eventData=79),
                                 SimpleNamespace(device=("gpu", 0), eventType=0x2, eventData=0)])
    monkeypatch.setitem(sys.modules, "pynvml", module)
    backend = NvmlBackend()
    backend.start()
    first, second, third = backend.wait_event(10), backend.wait_event(10), backend.wait_event(10)
    assert (first.uuid, first.xid, first.kind) == ("GPU-bbb", 79, "xid")
    assert (second.uuid, second.kind) == ("GPU-aaa", "ecc-double-bit")
    assert third is None  # a timeout is not an event


def test_a_failing_wait_is_an_event_for_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml()
    module.nvmlEventSetWait = lambda s, ms: (_ for _ in ()).throw(module.NVMLError_GpuIsLost("GPU is lost"))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    backend = NvmlBackend()
    backend.start()
    event = backend.wait_event(10)
    assert (event.uuid, event.kind, event.detail) == (None, "error", "GPU is lost")


@pytest.mark.parametrize(("error", "hint"), [
    ("LibraryNotFound", "is the container runtime nvidia"),
    ("DriverNotLoaded", "modprobe nvidia"),
    ("Unknown", "upgraded without a reboot"),
])
def test_init_errors_carry_the_runbook_hint(monkeypatch: pytest.MonkeyPatch, error: str, hint: str) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error=error))
    with pytest.raises(InitError) as raised:
        NvmlBackend().start()
    assert hint in raised.value.hint
