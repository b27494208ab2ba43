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


def device_dir(tmp_path: Path, minors: list[int]) -> Path:
    """A folder standing for a process's /dev: the control node and the given GPUs' nodes (their presence is what
    counts, as the real driver enumerates the GPUs a container's device nodes give it)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ["nvidiactl", *(f"nvidia{minor}" for minor in minors)]:
        (dev / name).touch()
    return dev


def test_a_process_sees_the_gpus_whose_device_node_it_has_numbered_from_zero(library: Path, tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    state = driver_state("node01", load_profile("a100x4-containerd"))
    monkeypatch.setenv("GPUNODE_SIM_DEV", str(device_dir(tmp_path, [state["gpus"][2]["minor"]])))
    found = run(library, tmp_path, state)
    assert len(found["nvml"]) == 1 and state["gpus"][2]["uuid"] in found["nvml"][0], found["nvml"]
    assert "index=0" in found["nvml"][0]


@pytest.mark.parametrize(("change", "minors", "code", "says"), [
    ({}, [1, 3], 0, ["GPU 0: NVIDIA A100-SXM4-40GB (UUID: {1})", "GPU 1: NVIDIA A100-SXM4-40GB (UUID: {3})"]),
    ({}, [], 6, ["No devices were found"]),
    ({"loaded": False}, [0], 9, ["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                 "Make sure that the latest NVIDIA driver is installed and running."]),
    ({"module_version": "535.161.08"}, [0], 18, ["Failed to initialize NVML: Driver/library version mismatch"]),
])
def test_the_native_nvidia_smi_lists_a_containers_gpus_without_python(tmp_path: Path, change: dict,
                                                                       minors: list[int], code: int,
                                                                       says: list[str]) -> None:
    """In a container (no node stand-in to hand over to) it answers -L from the state, as the library sees it."""
    smi = nvml_build.ensure_built(CACHE, lambda _: None).parent / nvml_build.SMI
    state = {**driver_state("node01", load_profile("a100x4-containerd")), **change}
    path = tmp_path / "gsp_gpunode_sim.bin"
    path.write_text(json.dumps(state))
    env = {"GPUNODE_SIM_GPU_STATE": str(path), "GPUNODE_SIM_DEV": str(device_dir(tmp_path, minors))}
    result = subprocess.run([str(smi), "-L"], capture_output=True, text=True, env=env, timeout=30, check=False)
    uuids = [g["uuid"] for g in state["gpus"]]
    assert (result.returncode, result.stdout.splitlines()) == (code, [line.format(*uuids) for line in says])
    refused = subprocess.run([str(smi), "-q"], capture_output=True, text=True, env=env, timeout=30, check=False)
    assert refused.returncode == 2 and "only -L is answered here" in refused.stderr
