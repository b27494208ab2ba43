"""The simulated ``nvidia-smi`` prints the real formats, exit codes and failure messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gpunode_sim.node.simnode import driver_files
from gpunode_sim.repos.aptrepo import render_standin
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile

DRIVER_DOWN = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.")


def smi(tmp_path: Path, profile: str, *args: str, faults: list[str] | None = None,
        driver: dict | None = None) -> subprocess.CompletedProcess[str]:
    data = load_profile(profile)
    if faults:
        data = dict(data, faults=faults)
    if driver:
        data = dict(data, driver={**data["driver"], **driver})
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps(driver_state("node01", data)))
    script = tmp_path / "nvidia-smi"
    script.write_text(render_standin("nvidia_smi.py"))
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env={"GPUNODE_SIM_GPU_STATE": str(state)}, check=False)


QUERY = ("--query-gpu=index,name,uuid,memory.total,driver_version,pci.bus_id,compute_cap,"
         "mig.mode.current,persistence_mode")


def test_query_with_header_and_units(tmp_path: Path) -> None:
    out = smi(tmp_path, "h100x8-nvswitch", QUERY, "--format=csv")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert lines[0] == ("index, name, uuid, memory.total [MiB], driver_version, pci.bus_id, compute_cap, "
                        "mig.mode.current, persistence_mode")
    first = lines[1].split(", ")
    assert first[1] == "NVIDIA H100 80GB HBM3" and first[3] == "81559 MiB" and first[6] == "9.0"
    assert first[5] == "00000000:19:00.0"
    assert len(lines) == 9


def test_query_noheader_nounits_and_na(tmp_path: Path) -> None:
    out = smi(tmp_path, "v100x2-docker", "--query-gpu=name,memory.total,mig.mode.current",
              "--format=csv,noheader,nounits")
    assert out.stdout.splitlines() == ["Tesla V100-SXM2-32GB, 32768, [N/A]"] * 2


def test_unknown_field_exits_2_with_the_real_message(tmp_path: Path) -> None:
    out = smi(tmp_path, "a100x4-containerd", "--query-gpu=cuda_version", "--format=csv")
    assert out.returncode == 2
    assert out.stderr.strip() == 'Field "cuda_version" is not a valid field to query.'


def test_list_gpus(tmp_path: Path) -> None:
    out = smi(tmp_path, "a100x4-containerd", "-L")
    assert out.returncode == 0
    assert out.stdout.splitlines()[0].startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    assert len(out.stdout.splitlines()) == 4


def test_summary_table_is_aligned(tmp_path: Path) -> None:
    out = smi(tmp_path, "a100x4-containerd")
    assert out.returncode == 0
    table = [line for line in out.stdout.splitlines() if line.startswith(("|", "+"))]
    assert {len(line) for line in table} == {91}
    assert "Driver Version: 550.54.15" in out.stdout and "CUDA Version: 12.4" in out.stdout


def test_full_query_has_fabric_state_on_nvswitch_nodes(tmp_path: Path) -> None:
    out = smi(tmp_path, "h100x8-nvswitch", "-q")
    assert "Attached GPUs                             : 8" in out.stdout
    assert "        State                             : Completed" in out.stdout
    down = smi(tmp_path, "h100x8-nvswitch", "-q", faults=["fabricmanager-down"])
    assert "        State                             : In Progress" in down.stdout


@pytest.mark.parametrize(
    ("faults", "code", "message"),
    [
        (["driver-not-loaded"], 9, DRIVER_DOWN),
        (["nouveau"], 9, DRIVER_DOWN),
        (["library-mismatch"], 18, "Failed to initialize NVML: Driver/library version mismatch"),
        (["no-gpu"], 6, "No devices were found"),
    ],
)
def test_faults_give_real_messages_and_codes(tmp_path: Path, faults: list[str], code: int, message: str) -> None:
    for args in ((), ("-L",), (QUERY, "--format=csv")):
        out = smi(tmp_path, "a100x4-containerd", *args, faults=faults)
        assert out.returncode == code
        assert out.stdout.splitlines()[0] == message


def test_newer_drivers_add_the_nvml_library_line(tmp_path: Path) -> None:
    out = smi(tmp_path, "a100x4-containerd", "-L", faults=["library-mismatch"],
              driver={"version": "580.126.09", "previous_version": "570.172.08"})
    assert out.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                       "NVML library version: 580.126"]


def test_gpu_fallen_off_the_bus(tmp_path: Path) -> None:
    out = smi(tmp_path, "a100x4-containerd", "-L", faults=["fallen-off-bus"])
    assert out.returncode == 15
    assert "GPU is lost" in out.stderr and "0000:07:00.0" in out.stderr


def test_driver_files_follow_the_state() -> None:
    state = driver_state("node01", load_profile("h100x8-nvswitch"))
    proc, sysmod, devices = driver_files(state)
    assert proc["nvidia/version"].startswith(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build")
    assert sysmod["nvidia/version"] == "550.54.15\n"
    assert len(proc["nvidia-nvswitch/devices"].splitlines()) == 4
    names = {d[0]: (d[1], d[2]) for d in devices}
    assert names["nvidia7"] == (195, 7) and names["nvidiactl"] == (195, 255)
    mismatch = driver_state("node01", dict(load_profile("a100x4-containerd"), faults=["library-mismatch"]))
    proc, sysmod, _ = driver_files(mismatch)
    assert "Kernel Module  535.183.01" in proc["nvidia/version"] and sysmod["nvidia/version"] == "535.183.01\n"
    not_loaded = driver_state("node01", dict(load_profile("a100x4-containerd"), faults=["nouveau"]))
    proc, sysmod, devices = driver_files(not_loaded)
    assert proc == {} and devices == [] and "nouveau/initstate" in sysmod


def test_memory_and_compute_state_are_answered_and_faults_change_them(tmp_path: Path) -> None:
    """The driver fact's health query and --query-remapped-rows: A100s remap rows (no page retirement)."""
    from gpunode.facts.driver import HEALTH_FIELDS, REMAP_FIELDS, DriverState

    fine = smi(tmp_path, "a100x4-containerd", f"--query-gpu={HEALTH_FIELDS}", "--format=csv,noheader,nounits")
    assert fine.returncode == 0 and fine.stdout.splitlines()[1] == "1, 0, [N/A], Default, Enabled"
    broken = smi(tmp_path, "a100x4-containerd", f"--query-gpu={HEALTH_FIELDS}", "--format=csv,noheader,nounits",
                 faults=["ecc-uncorrectable", "compute-prohibited", "persistence-off"])
    assert broken.stdout.splitlines()[:2] == ["0, 0, [N/A], Prohibited, Enabled", "1, 2, [N/A], Default, Disabled"]
    rows = smi(tmp_path, "a100x4-containerd", f"--query-remapped-rows={REMAP_FIELDS}", "--format=csv,noheader",
               faults=["ecc-uncorrectable"])
    assert [line.split(", ")[1:] for line in rows.stdout.splitlines()] == [["No", "No"], ["Yes", "No"],
                                                                          ["No", "No"], ["No", "No"]]
    state = DriverState().process(["##gpunode:health", *broken.stdout.splitlines(), "##gpunode:remap",
                                   *rows.stdout.splitlines()])
    assert (state["health"][1]["ecc_uncorrected"], state["health"][1]["persistence_mode"]) == (2, "Disabled")
    assert [v["pending"] for v in state["remapped_rows"].values()] == ["No", "Yes", "No", "No"]


def test_reset_status_is_answered_and_the_fault_sets_it(tmp_path: Path) -> None:
    """The driver fact's reset_status query: 'No' on a healthy GPU, 'Yes' on GPU 1 with the reset-required fault."""
    from gpunode.facts.driver import RESET_FIELDS, DriverState

    fine = smi(tmp_path, "a100x4-containerd", f"--query-gpu={RESET_FIELDS}", "--format=csv,noheader")
    assert fine.returncode == 0 and fine.stdout.splitlines()[1] == "1, No, No"
    broken = smi(tmp_path, "a100x4-containerd", f"--query-gpu={RESET_FIELDS}", "--format=csv,noheader",
                 faults=["reset-required"])
    assert broken.stdout.splitlines()[:2] == ["0, No, No", "1, Yes, No"]
    state = DriverState().process(["##gpunode:reset", *broken.stdout.splitlines()])
    assert [row["reset_required"] for row in state["reset_status"]] == ["No", "Yes", "No", "No"]


def test_mig_devices_are_listed_under_their_gpu_as_nvidia_smi_does(tmp_path: Path) -> None:
    """``mig: [profiles]`` in a profile creates those MIG devices; -L lists them in the reference format, and the
    driver fact reads them back (``mig: true``: MIG mode on, no device)."""
    from gpunode_sim.spec.gpus import driver_state

    from gpunode.facts.driver import DriverState

    data = dict(load_profile("a100x4-containerd"), gpu={"model": "a100-sxm4-40gb", "count": 1,
                                                        "mig": ["1g.5gb", "3g.20gb"]})
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps(driver_state("node01", data)))
    script = tmp_path / "nvidia-smi"
    script.write_text(render_standin("nvidia_smi.py"))
    listed = subprocess.run([sys.executable, str(script), "-L"], capture_output=True, text=True, check=True,
                            env={"GPUNODE_SIM_GPU_STATE": str(state)}).stdout.splitlines()
    assert listed[0].startswith("GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-")
    assert listed[1].startswith("  MIG 1g.5gb       Device  0: (UUID: MIG-") and "3g.20gb" in listed[2]
    fact = DriverState().process(["##gpunode:smi", "0, NVIDIA A100-SXM4-40GB, GPU-x, 40960, 550.54.15, "
                                  "00000000:07:00.0, 8.0, Enabled", "rc=0", "##gpunode:mig", *listed])
    assert fact["nvidia_smi"]["gpus"][0]["mig_devices"] == ["1g.5gb", "3g.20gb"]
