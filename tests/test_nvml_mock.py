"""The simulated nodes' libnvidia-ml.so.1 (NVML's C ABI over the node's GPU state), driven by the plugin's
production backend (nvidia-ml-py): it sees what the simulated backend and nvidia-smi's stand-in see, gets Xid and
ECC events through NVML's event set, and fails NVML's init the way the driver's states make NVML fail.

Each case runs in its own process: the library reads its state's path from the environment when it is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpunode_sim.build import nvml_build
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile

CACHE = Path(os.environ.get("GPUNODE_CACHE_DIR", "/var/cache/gpunode"))

SCRIPT = """
import json, sys, threading, time
from gpunode_plugin.backend import InitError
from gpunode_plugin.nvml_backend import NvmlBackend
from gpunode_plugin.sim_backend import SimBackend
root, state, events, lines = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
backend = NvmlBackend(root)
try:
    backend.start()
except InitError as error:
    print(json.dumps({"init_error": str(error)}))
    sys.exit(0)
found = [repr(g) for g in backend.gpus()]
expected = [repr(g) for g in SimBackend(state, events).gpus()]
def later():
    time.sleep(0.3)
    with open(events, "a") as handle:
        handle.write("".join(line + "\\n" for line in lines))
threading.Thread(target=later).start()
received = []
started = time.monotonic()
for _ in lines:
    event = backend.wait_event(3000)
    received.append(repr(event) if event else None)
took = time.monotonic() - started
backend.stop()
print(json.dumps({"nvml": found, "sim": expected, "events": received, "seconds": took}))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A driver root with the built library where the plugin looks for it (as the NVIDIA hook mounts it)."""
    built = nvml_build.ensure_built(CACHE, lambda _: None)
    root = tmp_path_factory.mktemp("driver-root")
    target = root / "usr/lib/x86_64-linux-gnu" / nvml_build.LIBRARY
    target.parent.mkdir(parents=True)
    target.symlink_to(built)
    return root


def run(library: Path, tmp_path: Path, state: dict, lines: list[str] = ()) -> dict:
    path, events = tmp_path / "gpu.json", tmp_path / "health-events"
    path.write_text(json.dumps(state))
    events.write_text("")
    env = {**os.environ, "GPUNODE_SIM_GPU_STATE": str(path), "GPUNODE_SIM_HEALTH_EVENTS": str(events)}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(library), str(path), str(events), json.dumps(lines)],
                            capture_output=True, text=True, env=env, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("profile", ["a100x4-containerd", "h100x8-nvswitch", "v100x2-docker", "mig"])
def test_nvml_sees_what_the_simulated_backend_sees(library: Path, tmp_path: Path, profile: str) -> None:
    data = (dict(load_profile("a100x4-containerd"), gpu={"model": "a100-sxm4-40gb", "count": 2,
                                                         "mig": ["1g.5gb", "3g.20gb"]})
            if profile == "mig" else load_profile(profile))
    found = run(library, tmp_path, driver_state("node01", data))
    assert found["nvml"] == found["sim"] and found["nvml"], found
    if profile == "mig":
        assert "profile='3g.20gb'" in found["nvml"][0] and "mig_enabled=True" in found["nvml"][0]


def test_xid_and_ecc_events_come_through_nvmls_event_set(library: Path, tmp_path: Path) -> None:
    state = driver_state("node01", load_profile("a100x4-containerd"))
    first, second = state["gpus"][0]["uuid"], state["gpus"][1]["uuid"]
    found = run(library, tmp_path, state, [f"{first} 79", f"{second} ecc", "all error the driver went away"])
    assert found["events"] == [f"HealthEvent(uuid='{first}', xid=79, kind='xid', detail='')",
                               f"HealthEvent(uuid='{second}', xid=None, kind='ecc-double-bit', detail='')",
                               "HealthEvent(uuid=None, xid=None, kind='error', detail='Unknown Error')"]
    assert found["seconds"] < 2.0  # the wait returns as the line lands (polled every 50 ms), not at its timeout


@pytest.mark.parametrize(("change", "says"), [
    ({"loaded": False}, "Driver Not Loaded"),
    ({"module_version": "535.161.08"}, "NVML/RM version mismatch"),  # nvidia-ml-py's own words for the code
])
def test_init_fails_as_nvml_does_for_the_drivers_state(library: Path, tmp_path: Path, change: dict,
                                                        says: str) -> None:
    state = {**driver_state("node01", load_profile("a100x4-containerd")), **change}
    assert says in run(library, tmp_path, state)["init_error"]
