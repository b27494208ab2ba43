"""The simulated ``lsmod`` lists the modules the node's driver state has loaded, in lsmod's format."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from gpunode_sim.repos.aptrepo import render_standin
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile

NVIDIA = ["nvidia_uvm           1347584  0", "nvidia_drm             73728  0",
          "nvidia_modeset       1294336  1 nvidia_drm", "nvidia              56713216  2 nvidia_uvm,nvidia_modeset"]


def lsmod(tmp_path: Path, faults: list[str], indent: int | None) -> list[str]:
    state = tmp_path / "gpu.json"
    profile = dict(load_profile("a100x4-containerd"), faults=faults)
    state.write_text(json.dumps(driver_state("node01", profile), indent=indent))
    script = tmp_path / "lsmod"
    script.write_text(render_standin("lsmod.sh"))
    result = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True,
                            env={"GPUNODE_SIM_GPU_STATE": str(state), "PATH": "/usr/bin:/bin"})
    return result.stdout.splitlines()


@pytest.mark.parametrize("indent", [None, 2])  # the test's compact file and the node's indented one
@pytest.mark.parametrize(("faults", "rows"), [
    ([], NVIDIA),
    (["driver-not-loaded"], []),
    (["nouveau"], ["nouveau              2269184  0"]),
    (["uvm-missing"], [NVIDIA[1], NVIDIA[2], "nvidia              56713216  1 nvidia_modeset"]),
])
def test_lsmod_lists_the_simulated_modules(tmp_path: Path, faults: list[str], rows: list[str],
                                           indent: int | None) -> None:
    lines = lsmod(tmp_path, faults, indent)
    assert lines[0] == "Module                  Size  Used by"
    kernel = len(Path("/proc/modules").read_text().splitlines()) if Path("/proc/modules").exists() else 0
    assert lines[1 + kernel:] == rows
