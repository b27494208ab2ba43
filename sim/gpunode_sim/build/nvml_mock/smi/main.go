// Command nvidia-smi is the simulated driver's nvidia-smi as a native program. On a node, where the node's Python
// stand-in is, it hands every call to that one (the summary, -q and --query-gpu formats checked against captures of
// the real tool). Inside a container, which has no Python (NVIDIA's CDI spec and NVIDIA's runtime in jit-cdi mode
// mount the driver's nvidia-smi into any image), it answers -L itself, from the same GPU state and with the same
// visibility rule as the simulated libnvidia-ml.so.1 (package gpustate): the GPUs whose device node the container
// was given, with the real tool's failure words and exit codes.
package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"

	"gpunode.local/nvmlmock/gpustate"
)

const (
	python      = "/usr/bin/python3"
	nodeStandIn = "/usr/lib/gpunode-sim/nvidia-smi"
	driverDown  = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. " +
		"Make sure that the latest NVIDIA driver is installed and running."
)

func main() {
	if _, err := os.Stat(nodeStandIn); err == nil {
		if _, err := os.Stat(python); err == nil {
			args := append([]string{python, nodeStandIn}, os.Args[1:]...)
			if err := syscall.Exec(python, args, os.Environ()); err != nil {
				fmt.Fprintf(os.Stderr, "nvidia-smi: %v\n", err)
				os.Exit(255)
			}
		}
	}
	os.Exit(list(os.Args[1:]))
}

func list(args []string) int {
	if len(args) != 1 || (args[0] != "-L" && args[0] != "--list-gpus") {
		fmt.Fprintf(os.Stderr, "nvidia-smi (simulated, in a container): only -L is answered here, not %q\n",
			strings.Join(args, " "))
		return 2
	}
	state, err := gpustate.Load()
	if err != nil || !state.Loaded || (state.Installed != nil && !*state.Installed) {
		fmt.Println(driverDown)
		return 9
	}
	// NVML opens the control node read-write first: a user who cannot fails so
	if ctl, err := os.OpenFile(gpustate.DevDir()+"/nvidiactl", os.O_RDWR, 0); err != nil {
		if os.IsPermission(err) {
			fmt.Println("Failed to initialize NVML: Insufficient Permissions")
			return 255
		}
	} else {
		ctl.Close()
	}
	if state.ModuleVersion != state.DriverVersion {
		fmt.Println("Failed to initialize NVML: Driver/library version mismatch")
		return 18
	}
	if state.NoDevices {
		state.Gpus = nil
	}
	gpustate.KeepVisible(state)
	if len(state.Gpus) == 0 {
		fmt.Println("No devices were found")
		return 6
	}
	for _, g := range state.Gpus {
		if g.FallenOffBus {
			bus := g.PciBusID
			if len(bus) > 4 {
				bus = bus[4:] // the domain's first four digits, as the real tool drops them
			}
			fmt.Fprintf(os.Stderr, "Unable to determine the device handle for GPU%s: GPU is lost.  "+
				"Reboot the system to recover this GPU\n", bus)
			return 15
		}
		fmt.Printf("GPU %d: %s (UUID: %s)\n", g.Index, g.Name, g.UUID)
		for number, mig := range g.MigDevices {
			fmt.Printf("  MIG %-12s Device %2d: (UUID: %s)\n", mig.Profile, number, mig.UUID)
		}
	}
	return 0
}
