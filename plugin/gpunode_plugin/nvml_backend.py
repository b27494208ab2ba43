"""GPUs through NVML (nvidia-ml-py), with Xid and double-bit ECC events for health."""

from __future__ import annotations

import ctypes
import os

from gpunode_plugin.backend import Gpu, HealthEvent, InitError, MigDevice, sysfs_numa_node

LIBRARY = "libnvidia-ml.so.1"
LIBRARY_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib/aarch64-linux-gnu", "usr/lib")


class NvmlBackend:
    name = "nvml"

    def __init__(self, driver_root: str = "/") -> None:
        self.driver_root = driver_root
        self._events = None
        self._by_handle: dict[int, str] = {}

    def start(self) -> None:
        import pynvml

        self.nvml = pynvml
        if self.driver_root not in ("", "/"):
            for folder in LIBRARY_DIRS:
                path = os.path.join(self.driver_root, folder, LIBRARY)
                if os.path.exists(path):
                    pynvml.nvmlLib = ctypes.CDLL(path)
                    break
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as error:
            raise InitError(f"NVML: {error}", f"{LIBRARY} was not found (driver root {self.driver_root}): is the "
                            "container runtime nvidia (default runtime or RuntimeClass)? If this is not a GPU "
                            "node, give the DaemonSet a nodeSelector or toleration") from error
        except pynvml.NVMLError_DriverNotLoaded as error:
            raise InitError(f"NVML: {error}", "the NVIDIA kernel module is not loaded: modprobe nvidia, then "
                            "check dmesg for NVRM errors") from error
        except pynvml.NVMLError as error:
            raise InitError(f"NVML: {error}", "nvidia-smi on the node shows the same error; a version mismatch "
                            "means the driver was upgraded without a reboot") from error
        self._events = self._register_events()

    def _versions(self) -> tuple[str, str]:
        """(driver version, CUDA version) as nvidia-smi prints them; '' for one NVML does not give."""
        nvml = self.nvml
        try:
            driver = nvml.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else str(driver)
        except nvml.NVMLError:
            driver = ""
        try:
            cuda = int(nvml.nvmlSystemGetCudaDriverVersion())  # 12040 for 12.4
            cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
        except nvml.NVMLError:
            cuda_text = ""
        return driver, cuda_text

    def _compute_capability(self, handle: object) -> str:
        try:
            major, minor = self.nvml.nvmlDeviceGetCudaComputeCapability(handle)
        except self.nvml.NVMLError:
            return ""
        return f"{major}.{minor}"

    def gpus(self) -> list[Gpu]:
        nvml = self.nvml
        driver, cuda = self._versions()
        result = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            bus = nvml.nvmlDeviceGetPciInfo(handle).busId
            bus = bus.decode() if isinstance(bus, bytes) else bus
            mig_enabled, migs = self._mig(handle, index)
            result.append(Gpu(index=index, uuid=uuid, name=nvml.nvmlDeviceGetName(handle),
                              memory_mib=nvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024),
                              minor=nvml.nvmlDeviceGetMinorNumber(handle), pci_bus_id=bus,
                              numa_node=sysfs_numa_node(bus), mig_enabled=mig_enabled, mig_devices=migs,
                              nvlink_peers=self._nvlink_peers(handle),
                              compute_capability=self._compute_capability(handle), driver_version=driver,
                              cuda_version=cuda))
        return result

    def _mig(self, handle: object, gpu_index: int) -> tuple[bool, tuple[MigDevice, ...]]:
        nvml = self.nvml
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return False, ()
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return False, ()
        devices = []
        for mig_index in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
                continue
            attributes = nvml.nvmlDeviceGetAttributes(mig)
            memory_gb = round(attributes.memorySizeMB / 1024)
            profile = f"{attributes.gpuInstanceSliceCount}g.{memory_gb}gb"
            if attributes.computeInstanceSliceCount != attributes.gpuInstanceSliceCount:
                continue  # NVIDIA exposes only GI-level profiles (C == G)
            devices.append(MigDevice(uuid=nvml.nvmlDeviceGetUUID(mig), profile=profile,
                                     index=f"{gpu_index}:{mig_index}",
                                     gpu_instance=nvml.nvmlDeviceGetGpuInstanceId(mig),
                                     compute_instance=nvml.nvmlDeviceGetComputeInstanceId(mig)))
        return True, tuple(devices)

    def _nvlink_peers(self, handle: object) -> tuple[str, ...]:
        nvml = self.nvml
        peers = []
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
                remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
                peer = nvml.nvmlDeviceGetHandleByPciBusId(remote)
                peers.append(nvml.nvmlDeviceGetUUID(peer))
            except nvml.NVMLError:
                continue
        return tuple(sorted(set(peers)))

    def _register_events(self) -> object | None:
        nvml = self.nvml
        event_set = nvml.nvmlEventSetCreate()
        mask = nvml.nvmlEventTypeXidCriticalError | nvml.nvmlEventTypeDoubleBitEccError
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            try:
                supported = nvml.nvmlDeviceGetSupportedEventTypes(handle)
                nvml.nvmlDeviceRegisterEvents(handle, mask & supported, event_set)
            except nvml.NVMLError_NotSupported:
                continue  # too old to support health checking: the device stays healthy
        return event_set

    def wait_event(self, timeout_ms: int) -> HealthEvent | None:
        nvml = self.nvml
        if self._events is None:
            return None
        try:
            data = nvml.nvmlEventSetWait(self._events, timeout_ms)
        except nvml.NVMLError_Timeout:
            return None
        except nvml.NVMLError as error:
            return HealthEvent(None, None, "error", str(error))
        try:
            uuid = nvml.nvmlDeviceGetUUID(data.device)
        except nvml.NVMLError:
            uuid = None
        if data.eventType == nvml.nvmlEventTypeDoubleBitEccError:
            return HealthEvent(uuid, None, "ecc-double-bit")
        return HealthEvent(uuid, int(data.eventData), "xid")

    def stop(self) -> None:
        if self._events is not None:
            self.nvml.nvmlEventSetFree(self._events)
        self.nvml.nvmlShutdown()
