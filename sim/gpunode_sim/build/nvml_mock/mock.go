// Package main is a mock libnvidia-ml.so.1 for gpunode's simulated GPU nodes: NVML's C ABI (the prototypes of
// NVIDIA's nvml.h, in shim.c) answering from the node's simulated GPU state, the file the nvidia-smi stand-in reads
// too, so the two never disagree. Health events (Xid, double-bit ECC, a failed wait) are lines appended to the
// node's health-events file, delivered through NVML's event-set API.
//
// Built by 'gpunode sim build' with -buildmode=c-shared. Where the state and the health events are read from, on the
// node and in a container, and which GPUs a process sees: package gpustate.
package main

/*
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <stdlib.h>
#include <string.h>
#include "nvml.h"
*/
import "C"

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"gpunode.local/nvmlmock/gpustate"
)

// the node's state, as package gpustate reads it (the native nvidia-smi reads it through the same package)
type (
	migDevice = gpustate.MigDevice
	gpu       = gpustate.Gpu
	state     = gpustate.State
)

// device is what a handle points at: a GPU, or one MIG device of it
type device struct {
	gpu *gpu
	mig *migDevice
}

var (
	lock     sync.Mutex
	loaded   *state
	handles  = map[uintptr]*device{}
	byGpu    = map[uint]C.nvmlDevice_t{}
	byMig    = map[string]C.nvmlDevice_t{}
	sets     = map[uintptr]*eventSet{}
	messages = map[C.nvmlReturn_t]*C.char{}
)

type eventSet struct {
	offset int64
	mask   map[string]uint64 // GPU UUID -> registered event types
}

func newHandle(d *device) C.nvmlDevice_t {
	var handle C.nvmlDevice_t // a pointer of its own per device: NVML's handles are opaque pointers
	handle.handle = (*C.struct_nvmlDevice_st)(C.malloc(8))
	handles[uintptr(unsafe.Pointer(handle.handle))] = d
	return handle
}

func lookup(handle C.nvmlDevice_t) *device {
	return handles[uintptr(unsafe.Pointer(handle.handle))]
}

//export goInit
func goInit() C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	found, err := gpustate.Load()
	if os.IsNotExist(err) {
		return C.NVML_ERROR_LIBRARY_NOT_FOUND
	}
	if err != nil {
		return C.NVML_ERROR_UNKNOWN
	}
	read := *found
	if read.Installed != nil && !*read.Installed {
		return C.NVML_ERROR_LIBRARY_NOT_FOUND
	}
	if !read.Loaded {
		return C.NVML_ERROR_DRIVER_NOT_LOADED
	}
	if read.ModuleVersion != read.DriverVersion {
		return C.NVML_ERROR_LIB_RM_VERSION_MISMATCH
	}
	if read.NoDevices {
		read.Gpus = nil
	}
	gpustate.KeepVisible(&read) // a container's process sees the GPUs whose device node it was given
	loaded = &read
	for i := range loaded.Gpus {
		g := &loaded.Gpus[i]
		if _, ok := byGpu[g.Index]; !ok {
			byGpu[g.Index] = newHandle(&device{gpu: g})
		} else {
			handles[uintptr(unsafe.Pointer(byGpu[g.Index].handle))] = &device{gpu: g}
		}
		for j := range g.MigDevices {
			m := &g.MigDevices[j]
			if _, ok := byMig[m.UUID]; !ok {
				byMig[m.UUID] = newHandle(&device{gpu: g, mig: m})
			}
		}
	}
	return C.NVML_SUCCESS
}

//export goShutdown
func goShutdown() C.nvmlReturn_t {
	return C.NVML_SUCCESS
}

// the texts of nvmlErrorString for the codes this mock returns
var errorTexts = map[C.nvmlReturn_t]string{
	C.NVML_SUCCESS: "Success", C.NVML_ERROR_UNINITIALIZED: "Uninitialized",
	C.NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument", C.NVML_ERROR_NOT_SUPPORTED: "Not Supported",
	C.NVML_ERROR_NO_PERMISSION: "Insufficient Permissions", C.NVML_ERROR_NOT_FOUND: "Not Found",
	C.NVML_ERROR_INSUFFICIENT_SIZE: "Insufficient Size", C.NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
	C.NVML_ERROR_TIMEOUT: "Timeout", C.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
	C.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch", C.NVML_ERROR_UNKNOWN: "Unknown Error",
}

//export goErrorString
func goErrorString(code C.nvmlReturn_t) *C.char {
	lock.Lock()
	defer lock.Unlock()
	if text, ok := messages[code]; ok {
		return text
	}
	text, ok := errorTexts[code]
	if !ok {
		text = "Unknown Error"
	}
	messages[code] = C.CString(text) // kept for the process: NVML's strings are static
	return messages[code]
}

func copyString(value string, target *C.char, length C.uint) C.nvmlReturn_t {
	if target == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	if C.uint(len(value)+1) > length {
		return C.NVML_ERROR_INSUFFICIENT_SIZE
	}
	text := C.CString(value)
	defer C.free(unsafe.Pointer(text))
	C.strncpy(target, text, C.size_t(length))
	return C.NVML_SUCCESS
}

func ready() bool {
	return loaded != nil
}

//export goDriverVersion
func goDriverVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	return copyString(loaded.DriverVersion, version, length)
}

//export goNvmlVersion
func goNvmlVersion(version *C.char, length C.uint) C.nvmlReturn_t {
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	major := strings.SplitN(loaded.CudaVersion, ".", 2)[0]
	return copyString(major+"."+loaded.DriverVersion, version, length)
}

//export goCudaVersion
func goCudaVersion(version *C.int) C.nvmlReturn_t {
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	parts := strings.SplitN(loaded.CudaVersion, ".", 2)
	major, _ := strconv.Atoi(parts[0])
	minor := 0
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	*version = C.int(major*1000 + minor*10)
	return C.NVML_SUCCESS
}

//export goDeviceCount
func goDeviceCount(count *C.uint) C.nvmlReturn_t {
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	*count = C.uint(len(loaded.Gpus))
	return C.NVML_SUCCESS
}

//export goHandleByIndex
func goHandleByIndex(index C.uint, handle *C.nvmlDevice_t) C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	for _, g := range loaded.Gpus {
		if g.Index == uint(index) {
			*handle = byGpu[g.Index]
			return C.NVML_SUCCESS
		}
	}
	return C.NVML_ERROR_INVALID_ARGUMENT
}

//export goHandleByUUID
func goHandleByUUID(uuid *C.char, handle *C.nvmlDevice_t) C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	wanted := C.GoString(uuid)
	for _, g := range loaded.Gpus {
		if g.UUID == wanted {
			*handle = byGpu[g.Index]
			return C.NVML_SUCCESS
		}
	}
	if mig, ok := byMig[wanted]; ok {
		*handle = mig
		return C.NVML_SUCCESS
	}
	return C.NVML_ERROR_NOT_FOUND
}

//export goHandleByPciBusId
func goHandleByPciBusId(bus *C.char, handle *C.nvmlDevice_t) C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	wanted := legacyBusID(C.GoString(bus))
	for _, g := range loaded.Gpus {
		if legacyBusID(g.PciBusID) == wanted {
			*handle = byGpu[g.Index]
			return C.NVML_SUCCESS
		}
	}
	return C.NVML_ERROR_NOT_FOUND
}

// legacyBusID is a PCI bus id as "dddd:bb:dd.f" (NVML takes the 8-digit domain form and the 4-digit one alike)
func legacyBusID(bus string) string {
	bus = strings.ToLower(bus)
	if len(bus) > 12 {
		return bus[len(bus)-12:]
	}
	return bus
}

func get(handle C.nvmlDevice_t) (*device, C.nvmlReturn_t) {
	lock.Lock()
	defer lock.Unlock()
	if !ready() {
		return nil, C.NVML_ERROR_UNINITIALIZED
	}
	d := lookup(handle)
	if d == nil {
		return nil, C.NVML_ERROR_INVALID_ARGUMENT
	}
	return d, C.NVML_SUCCESS
}

//export goIndex
func goIndex(handle C.nvmlDevice_t, index *C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	*index = C.uint(d.gpu.Index)
	return C.NVML_SUCCESS
}

//export goName
func goName(handle C.nvmlDevice_t, name *C.char, length C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if d.mig != nil {
		return copyString(fmt.Sprintf("%s MIG %s", d.gpu.Name, d.mig.Profile), name, length)
	}
	return copyString(d.gpu.Name, name, length)
}

//export goUUID
func goUUID(handle C.nvmlDevice_t, uuid *C.char, length C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if d.mig != nil {
		return copyString(d.mig.UUID, uuid, length)
	}
	return copyString(d.gpu.UUID, uuid, length)
}

//export goMinor
func goMinor(handle C.nvmlDevice_t, minor *C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	*minor = C.uint(d.gpu.Minor)
	return C.NVML_SUCCESS
}

// profileShape is a MIG profile's slices and memory: "3g.20gb" is 3 slices, 20 GiB
func profileShape(profile string) (uint, uint64) {
	parts := strings.SplitN(profile, ".", 3)
	slices, _ := strconv.Atoi(strings.TrimSuffix(parts[0], "g"))
	memory := 0
	if len(parts) > 1 {
		memory, _ = strconv.Atoi(strings.TrimSuffix(parts[1], "gb"))
	}
	return uint(slices), uint64(memory) * 1024
}

//export goMemory
func goMemory(handle C.nvmlDevice_t, memory *C.nvmlMemory_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	total := d.gpu.MemoryMiB * 1024 * 1024
	if d.mig != nil {
		_, mib := profileShape(d.mig.Profile)
		total = mib * 1024 * 1024
	}
	memory.total = C.ulonglong(total)
	memory.free = C.ulonglong(total)
	memory.used = 0
	return C.NVML_SUCCESS
}

func fillPci(g *gpu, pci *C.nvmlPciInfo_t) {
	C.memset(unsafe.Pointer(pci), 0, C.size_t(unsafe.Sizeof(*pci)))
	bus := g.PciBusID // "00000000:07:00.0"
	full := C.CString(bus)
	defer C.free(unsafe.Pointer(full))
	C.strncpy(&pci.busId[0], full, C.NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE-1)
	legacy := C.CString(legacyBusID(bus)) // "0000:07:00.0"
	defer C.free(unsafe.Pointer(legacy))
	C.strncpy(&pci.busIdLegacy[0], legacy, C.NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE-1)
	fields := strings.Split(strings.ReplaceAll(bus, ".", ":"), ":")
	if len(fields) == 4 {
		domain, _ := strconv.ParseUint(fields[0], 16, 32)
		number, _ := strconv.ParseUint(fields[1], 16, 32)
		slot, _ := strconv.ParseUint(fields[2], 16, 32)
		pci.domain, pci.bus, pci.device = C.uint(domain), C.uint(number), C.uint(slot)
	}
	id, _ := strconv.ParseUint(strings.TrimPrefix(g.PciDeviceID, "0x"), 16, 32)
	pci.pciDeviceId = C.uint(id)
}

//export goPciInfo
func goPciInfo(handle C.nvmlDevice_t, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	fillPci(d.gpu, pci)
	return C.NVML_SUCCESS
}

//export goComputeCapability
func goComputeCapability(handle C.nvmlDevice_t, major *C.int, minor *C.int) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	parts := strings.SplitN(d.gpu.ComputeCap, ".", 2)
	high, _ := strconv.Atoi(parts[0])
	low := 0
	if len(parts) > 1 {
		low, _ = strconv.Atoi(parts[1])
	}
	*major, *minor = C.int(high), C.int(low)
	return C.NVML_SUCCESS
}

//export goMigMode
func goMigMode(handle C.nvmlDevice_t, current *C.uint, pending *C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if d.mig != nil {
		return C.NVML_ERROR_NOT_SUPPORTED
	}
	mode := C.uint(C.NVML_DEVICE_MIG_DISABLE)
	if d.gpu.MigMode == "Enabled" {
		mode = C.NVML_DEVICE_MIG_ENABLE
	}
	*current, *pending = mode, mode
	return C.NVML_SUCCESS
}

//export goMaxMigDeviceCount
func goMaxMigDeviceCount(handle C.nvmlDevice_t, count *C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	*count = 0
	if d.gpu.MigMode == "Enabled" {
		*count = 7 // the A100/H100 maximum
	}
	return C.NVML_SUCCESS
}

//export goMigDeviceHandleByIndex
func goMigDeviceHandleByIndex(handle C.nvmlDevice_t, index C.uint, mig *C.nvmlDevice_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if d.gpu.MigMode != "Enabled" {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	if int(index) >= len(d.gpu.MigDevices) {
		return C.NVML_ERROR_NOT_FOUND
	}
	lock.Lock()
	defer lock.Unlock()
	*mig = byMig[d.gpu.MigDevices[index].UUID]
	return C.NVML_SUCCESS
}

//export goIsMigDeviceHandle
func goIsMigDeviceHandle(handle C.nvmlDevice_t, isMig *C.uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	*isMig = 0
	if d.mig != nil {
		*isMig = 1
	}
	return C.NVML_SUCCESS
}

//export goParentOfMig
func goParentOfMig(handle C.nvmlDevice_t, parent *C.nvmlDevice_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	lock.Lock()
	defer lock.Unlock()
	*parent = byGpu[d.gpu.Index]
	return C.NVML_SUCCESS
}

//export goAttributes
func goAttributes(handle C.nvmlDevice_t, attributes *C.nvmlDeviceAttributes_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	C.memset(unsafe.Pointer(attributes), 0, C.size_t(unsafe.Sizeof(*attributes)))
	if d.mig == nil {
		attributes.memorySizeMB = C.ulonglong(d.gpu.MemoryMiB)
		return C.NVML_SUCCESS
	}
	slices, mib := profileShape(d.mig.Profile)
	attributes.gpuInstanceSliceCount = C.uint(slices)
	attributes.computeInstanceSliceCount = C.uint(slices)
	attributes.memorySizeMB = C.ulonglong(mib)
	return C.NVML_SUCCESS
}

// migInstance answers an instance-id call: the MIG device's id chosen by pick, INVALID_ARGUMENT for a whole GPU
func migInstance(handle C.nvmlDevice_t, id *C.uint, pick func(*migDevice) uint) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if d.mig == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	*id = C.uint(pick(d.mig))
	return C.NVML_SUCCESS
}

//export goGpuInstanceId
func goGpuInstanceId(handle C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return migInstance(handle, id, func(m *migDevice) uint { return m.GpuInstance })
}

//export goComputeInstanceId
func goComputeInstanceId(handle C.nvmlDevice_t, id *C.uint) C.nvmlReturn_t {
	return migInstance(handle, id, func(m *migDevice) uint { return m.ComputeInstance })
}

//export goNvLinkState
func goNvLinkState(handle C.nvmlDevice_t, link C.uint, active *C.nvmlEnableState_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if int(link) >= C.NVML_NVLINK_MAX_LINKS {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	*active = C.NVML_FEATURE_DISABLED
	if int(link) < len(d.gpu.NvlinkPeers) {
		*active = C.NVML_FEATURE_ENABLED
	}
	return C.NVML_SUCCESS
}

//export goNvLinkRemotePciInfo
func goNvLinkRemotePciInfo(handle C.nvmlDevice_t, link C.uint, pci *C.nvmlPciInfo_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	if int(link) >= len(d.gpu.NvlinkPeers) {
		return C.NVML_ERROR_NOT_SUPPORTED
	}
	for i := range loaded.Gpus {
		if loaded.Gpus[i].UUID == d.gpu.NvlinkPeers[link] {
			fillPci(&loaded.Gpus[i], pci)
			return C.NVML_SUCCESS
		}
	}
	return C.NVML_ERROR_NOT_FOUND
}

func eventsFile() string {
	return gpustate.EventsFile()
}

//export goEventSetCreate
func goEventSetCreate(set *C.nvmlEventSet_t) C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	if !ready() {
		return C.NVML_ERROR_UNINITIALIZED
	}
	var handle C.nvmlEventSet_t
	handle.handle = (*C.struct_nvmlEventSet_st)(C.malloc(8))
	var offset int64
	if info, err := os.Stat(eventsFile()); err == nil {
		offset = info.Size() // events from now on, as NVML delivers what happens after registration
	}
	sets[uintptr(unsafe.Pointer(handle.handle))] = &eventSet{offset: offset, mask: map[string]uint64{}}
	*set = handle
	return C.NVML_SUCCESS
}

const supportedEvents = C.nvmlEventTypeXidCriticalError | C.nvmlEventTypeDoubleBitEccError |
	C.nvmlEventTypeSingleBitEccError

//export goSupportedEventTypes
func goSupportedEventTypes(handle C.nvmlDevice_t, types *C.ulonglong) C.nvmlReturn_t {
	if _, code := get(handle); code != C.NVML_SUCCESS {
		return code
	}
	*types = supportedEvents
	return C.NVML_SUCCESS
}

//export goRegisterEvents
func goRegisterEvents(handle C.nvmlDevice_t, types C.ulonglong, set C.nvmlEventSet_t) C.nvmlReturn_t {
	d, code := get(handle)
	if code != C.NVML_SUCCESS {
		return code
	}
	lock.Lock()
	defer lock.Unlock()
	registered := sets[uintptr(unsafe.Pointer(set.handle))]
	if registered == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	if uint64(types)&^uint64(supportedEvents) != 0 {
		return C.NVML_ERROR_NOT_SUPPORTED
	}
	registered.mask[d.gpu.UUID] |= uint64(types)
	return C.NVML_SUCCESS
}

// nextLine is the next whole line of the events file after offset, and the offset after it ("" when none)
func nextLine(offset int64) (string, int64) {
	file, err := os.Open(eventsFile())
	if err != nil {
		return "", offset
	}
	defer file.Close()
	if _, err := file.Seek(offset, 0); err != nil {
		return "", offset
	}
	line, err := bufio.NewReader(file).ReadString('\n')
	if err != nil {
		return "", offset // no whole line yet
	}
	return line, offset + int64(len(line))
}

//export goEventSetWait
func goEventSetWait(set C.nvmlEventSet_t, data *C.nvmlEventData_t, timeout C.uint) C.nvmlReturn_t {
	lock.Lock()
	registered := sets[uintptr(unsafe.Pointer(set.handle))]
	lock.Unlock()
	if registered == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	deadline := time.Now().Add(time.Duration(timeout) * time.Millisecond)
	for {
		lock.Lock()
		line, next := nextLine(registered.offset)
		registered.offset = next
		lock.Unlock()
		words := strings.Fields(line)
		if len(words) > 0 {
			if words[0] == "all" {
				return C.NVML_ERROR_UNKNOWN // the wait itself fails, as when the driver goes away
			}
			var eventType, eventData uint64
			switch {
			case len(words) > 1 && words[1] == "ecc":
				eventType = uint64(C.nvmlEventTypeDoubleBitEccError)
			case len(words) > 1:
				xid, err := strconv.ParseUint(words[1], 10, 64)
				if err != nil {
					xid = 999 // NVML's "unknown Xid"
				}
				eventType, eventData = uint64(C.nvmlEventTypeXidCriticalError), xid
			default:
				continue
			}
			lock.Lock()
			mask := registered.mask[words[0]]
			var handle C.nvmlDevice_t
			for _, g := range loaded.Gpus {
				if g.UUID == words[0] {
					handle = byGpu[g.Index]
				}
			}
			lock.Unlock()
			if handle.handle == nil || mask&eventType == 0 {
				continue // not a registered device or event type: NVML does not deliver it
			}
			C.memset(unsafe.Pointer(data), 0, C.size_t(unsafe.Sizeof(*data)))
			data.device = handle
			data.eventType = C.ulonglong(eventType)
			data.eventData = C.ulonglong(eventData)
			data.gpuInstanceId = 0xFFFFFFFF
			data.computeInstanceId = 0xFFFFFFFF
			return C.NVML_SUCCESS
		}
		if !time.Now().Before(deadline) {
			return C.NVML_ERROR_TIMEOUT
		}
		time.Sleep(50 * time.Millisecond)
	}
}

//export goEventSetFree
func goEventSetFree(set C.nvmlEventSet_t) C.nvmlReturn_t {
	lock.Lock()
	defer lock.Unlock()
	key := uintptr(unsafe.Pointer(set.handle))
	if sets[key] == nil {
		return C.NVML_ERROR_INVALID_ARGUMENT
	}
	delete(sets, key)
	C.free(unsafe.Pointer(set.handle))
	return C.NVML_SUCCESS
}

func main() {}
