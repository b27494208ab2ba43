// Package gpustate is the simulated GPU hardware as the simulated driver's programs see it: where the node's GPU
// state and health-event files are, read from the node or from inside a container, and which GPUs a process can
// see. The mock libnvidia-ml.so.1 and the native nvidia-smi both read it through this package, so they cannot
// disagree.
//
// Inside a container the files are found where NVIDIA's CDI generator mounts the driver's firmware
// (/lib/firmware/nvidia/<driver version>/gsp*.bin, which 'nvidia-ctk cdi generate' and NVIDIA's runtime in jit-cdi
// mode mount into every GPU container): the simulated node links its state and health-event files there, so any
// container given the driver's files, by NVIDIA's spec or NVIDIA's runtime, reaches the simulated hardware as a
// real container reaches the GPU through the driver. As the real driver does, a process sees only the GPUs whose
// device node it has (a container given one GPU enumerates that one, as index 0).
package gpustate

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// NodeState and NodeEvents are the node's own files; the firmware names are their links in the driver's firmware
// folder (what a container is given).
const (
	NodeState      = "/etc/gpunode-sim/gpu.json"
	NodeEvents     = "/run/gpunode-sim/events/health-events"
	FirmwareState  = "/lib/firmware/nvidia/*/gsp_gpunode_sim.bin"
	FirmwareEvents = "/lib/firmware/nvidia/*/gsp_gpunode_sim_events.bin"
)

type MigDevice struct {
	UUID            string `json:"uuid"`
	Profile         string `json:"profile"`
	GpuInstance     uint   `json:"gpu_instance"`
	ComputeInstance uint   `json:"compute_instance"`
}

type Gpu struct {
	Index        uint        `json:"index"`
	Minor        uint        `json:"minor"`
	Name         string      `json:"name"`
	UUID         string      `json:"uuid"`
	MemoryMiB    uint64      `json:"memory_total_mib"`
	ComputeCap   string      `json:"compute_cap"`
	PciBusID     string      `json:"pci_bus_id"`
	PciDeviceID  string      `json:"pci_device_id"`
	MigMode      string      `json:"mig_mode"`
	MigDevices   []MigDevice `json:"mig_devices"`
	NvlinkPeers  []string    `json:"nvlink_peers"`
	FallenOffBus bool        `json:"fallen_off_bus"`
}

type State struct {
	DriverVersion string `json:"driver_version"`
	ModuleVersion string `json:"module_version"`
	CudaVersion   string `json:"cuda_version"`
	Loaded        bool   `json:"loaded"`
	Installed     *bool  `json:"installed"`
	NoDevices     bool   `json:"no_devices"`
	Gpus          []Gpu  `json:"gpus"`
}

func located(variable, node, firmware string) string {
	if value := os.Getenv(variable); value != "" {
		return value
	}
	if _, err := os.Stat(filepath.Dir(node)); err == nil {
		return node
	}
	if found, _ := filepath.Glob(firmware); len(found) > 0 {
		return found[0]
	}
	return node
}

// StateFile is the GPU state: $GPUNODE_SIM_GPU_STATE, the node's file, or its link in the firmware folder.
func StateFile() string {
	return located("GPUNODE_SIM_GPU_STATE", NodeState, FirmwareState)
}

// EventsFile is the health-event file: $GPUNODE_SIM_HEALTH_EVENTS, the node's, or its link in the firmware folder.
func EventsFile() string {
	return located("GPUNODE_SIM_HEALTH_EVENTS", NodeEvents, FirmwareEvents)
}

// DevDir is where the device nodes are: $GPUNODE_SIM_DEV, else /dev.
func DevDir() string {
	if value := os.Getenv("GPUNODE_SIM_DEV"); value != "" {
		return value
	}
	return "/dev"
}

// Load reads the state file (an error where there is none or it does not parse).
func Load() (*State, error) {
	data, err := os.ReadFile(StateFile())
	if err != nil {
		return nil, err
	}
	var read State
	if err := json.Unmarshal(data, &read); err != nil {
		return nil, err
	}
	return &read, nil
}

// KeepVisible leaves the GPUs whose device node this process has, numbered from 0 in the node's order, where the
// driver's control node is there (a node, or a GPU container); elsewhere (a test on a machine without the
// simulated devices) every GPU.
func KeepVisible(s *State) {
	dev := DevDir()
	if _, err := os.Stat(filepath.Join(dev, "nvidiactl")); err != nil {
		return
	}
	var kept []Gpu
	for _, g := range s.Gpus {
		if _, err := os.Stat(filepath.Join(dev, fmt.Sprintf("nvidia%d", g.Minor))); err == nil {
			g.Index = uint(len(kept))
			kept = append(kept, g)
		}
	}
	s.Gpus = kept
}
