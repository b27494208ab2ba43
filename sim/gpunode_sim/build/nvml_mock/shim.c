// The NVML entry points the device plugin (nvidia-ml-py) calls, with the exact prototypes of NVIDIA's nvml.h
// (from github.com/NVIDIA/go-nvml), each handing over to the Go code of this mock (mock.go), which answers from
// the simulated node's GPU state. Names and types are NVML's; the behaviour is the simulated driver's.
// the unversioned names too (older callers), each its own symbol
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "nvml.h"
#include "_cgo_export.h"

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return goInit(); }
nvmlReturn_t nvmlInit_v2(void) { return goInit(); }
nvmlReturn_t nvmlInit(void) { return goInit(); }
nvmlReturn_t nvmlShutdown(void) { return goShutdown(); }
const char *nvmlErrorString(nvmlReturn_t result) { return goErrorString(result); }
nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) { return goDriverVersion(version, length); }
nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) { return goNvmlVersion(version, length); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) { return goCudaVersion(cudaDriverVersion); }
nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) { return goCudaVersion(cudaDriverVersion); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) { return goDeviceCount(deviceCount); }
nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return goDeviceCount(deviceCount); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return goHandleByIndex(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return goHandleByIndex(index, device);
}
nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    return goHandleByUUID((char *)uuid, device);
}
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device) {
    return goHandleByPciBusId((char *)pciBusId, device);
}
nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index) { return goIndex(device, index); }
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    return goName(device, name, length);
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    return goUUID(device, uuid, length);
}
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    return goMinor(device, minorNumber);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) { return goMemory(device, memory); }
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) { return goPciInfo(device, pci); }
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) { return goPciInfo(device, pci); }
nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    return goComputeCapability(device, major, minor);
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode) {
    return goMigMode(device, currentMode, pendingMode);
}
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    return goMaxMigDeviceCount(device, count);
}
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice) {
    return goMigDeviceHandleByIndex(device, index, migDevice);
}
nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    return goIsMigDeviceHandle(device, isMigDevice);
}
nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice, nvmlDevice_t *device) {
    return goParentOfMig(migDevice, device);
}
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    return goAttributes(device, attributes);
}
nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) { return goGpuInstanceId(device, id); }
nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    return goComputeInstanceId(device, id);
}
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive) {
    return goNvLinkState(device, link, isActive);
}
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci) {
    return goNvLinkRemotePciInfo(device, link, pci);
}
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) { return goEventSetCreate(set); }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes) {
    return goSupportedEventTypes(device, eventTypes);
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set) {
    return goRegisterEvents(device, eventTypes, set);
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return goEventSetWait(set, data, timeoutms);
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { return goEventSetFree(set); }
