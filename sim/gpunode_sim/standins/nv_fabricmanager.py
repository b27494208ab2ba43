#!/usr/bin/python3
"""Stand-in for NVIDIA's fabric manager daemon on simulated NVSwitch nodes."""

import json
import signal
import sys
import time

with open("/etc/gpunode-sim/gpu.json") as handle:
    STATE = json.load(handle)
VERSION = STATE["fabricmanager"]["version"]

if "--version" in sys.argv or "-v" in sys.argv:
    print(f"Fabric Manager version is : {VERSION}")
    sys.exit(0)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"Fabric Manager version {VERSION} running with {STATE['nvswitch_count']} NVSwitches", flush=True)
while True:
    time.sleep(3600)
