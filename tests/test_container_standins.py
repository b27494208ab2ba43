"""The simulated driver's side of a GPU container: nvidia-container-cli's stand-in takes what NVIDIA's own hook
passes it and fails with the real cli's words; the 1.20 runtime stand-in adds NVIDIA's hook as NVIDIA's runtime
does in legacy mode; the workload image's CUDA probe takes contexts as the GPU's compute mode allows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest
from gpunode_sim.build import toolkit_build
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.images.workload_image import CUDA_PROBE

STANDINS = Path(__file__).parents[1] / "sim/gpunode_sim/standins"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, STANDINS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli = load("nvidia_container_cli")
DRIVER = {"cuda_version": "12.4", "driver_version": "550.54.15"}


@pytest.mark.parametrize(("requirements", "refused"), [
    ([], None),
    (["cuda>=12.4"], None),
    (["cuda>=12.6"], "cuda>=12.6"),
    # a CUDA image's forward-compatibility alternatives: space-separated groups, any one suffices
    (["cuda>=12.6 brand=tesla,driver>=550,driver<551"], "cuda>=12.6"),  # brand not simulated
    (["cuda>=12.6 driver>=550,driver<551"], None),
    (["cuda>=11.0 driver>=560"], None),
    (["cuda>=12.0", "cuda>=12.8"], "cuda>=12.8"),  # one --require per NVIDIA_REQUIRE_* variable: all must hold
])
def test_require_is_judged_against_the_driver(requirements: list[str], refused: str | None) -> None:
    if refused is None:
        cli.check_require(requirements, DRIVER)
        return
    with pytest.raises(cli.CliFailed) as caught:
        cli.check_require(requirements, DRIVER)
    assert str(caught.value) == (f"nvidia-container-cli: requirement error: unsatisfied condition: {refused}, please "
                                 "update your driver to a newer version, or use an earlier cuda container")


def test_a_missing_host_ldconfig_fails_with_the_clis_words() -> None:
    cli.check_ldconfig("@/bin/sh")  # any host file will do
    cli.check_ldconfig("/sbin/ldconfig")  # container-relative: not the host's to check
    with pytest.raises(cli.CliFailed, match="^nvidia-container-cli: ldcache error: open failed: "
                                            "/sbin/ldconfig.gone: no such file or directory$"):
        cli.check_ldconfig("@/sbin/ldconfig.gone")


def test_the_devices_the_hook_names_are_the_gpus_selected() -> None:
    gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}, {"index": 2, "uuid": "GPU-c"}]
    assert cli.selected_gpus(["all"], gpus) == gpus
    assert cli.selected_gpus(["GPU-c,0"], gpus) == [gpus[0], gpus[2]]
    assert cli.selected_gpus([], gpus) == []  # NVIDIA_VISIBLE_DEVICES=none: the driver, no GPU
    gpus[1]["mig_devices"] = [{"uuid": "MIG-b0"}, {"uuid": "MIG-b1"}]
    assert cli.selected_gpus(["MIG-b1"], gpus) == cli.selected_gpus(["1:0"], gpus) == [gpus[1]]
    # the words NVIDIA's issues quote: an index past the last GPU, and the volume-mounts root passed as a device
    # because the toolkit does not take devices from mounts (nvidia-container-toolkit issue 108)
    for unknown in ("3", "/var/run/nvidia-container-devices", "1:2"):
        with pytest.raises(cli.CliFailed) as caught:
            cli.selected_gpus([unknown], gpus)
        assert str(caught.value) == f"nvidia-container-cli: device error: {unknown}: unknown device"


def test_a_context_is_freed_once_its_containers_first_process_is_gone(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "CONTEXTS", str(tmp_path / "contexts"))
    monkeypatch.setattr(cli, "SELECTED_DIR", str(tmp_path / "containers"))
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        mine = f"{sleeper.pid} {cli.start_time(str(sleeper.pid))}"
        for folder, owner in (("contexts/GPU-live", mine), ("contexts/GPU-dead", "999999999 1"),
                              ("contexts/GPU-other", "a container id"), ("containers/c1", "999999999 1")):
            (tmp_path / folder).mkdir(parents=True)
            (tmp_path / folder / "owner").write_text(owner + "\n")
        assert cli.alive(mine) and not cli.alive("999999999 1") and not cli.alive(f"{sleeper.pid} 1")
        cli.free_dead_contexts()
        assert sorted(os.listdir(tmp_path / "contexts")) == ["GPU-live", "GPU-other"]
        assert os.listdir(tmp_path / "containers") == []
    finally:
        sleeper.kill()
        sleeper.wait()
    cli.free_dead_contexts()
    assert sorted(os.listdir(tmp_path / "contexts")) == ["GPU-other"]  # not in the form this program writes


def test_the_mounts_give_the_container_the_driver_and_the_hardwares_state() -> None:
    script = cli.mount_script("/b/rootfs", [], "/run/gpunode-sim/containers/c1")
    assert "mount --bind '/run/gpunode-sim/containers/c1/nvidia-smi' '/b/rootfs/usr/bin/nvidia-smi'" in script
    for read_only in ("/etc/gpunode-sim/gpu.json", "/run/gpunode-sim/events", "/run/gpunode-sim/container"):
        assert f"mount -o remount,bind,ro '/b/rootfs{read_only}'" in script, read_only
    assert "mount --bind '/run/gpunode-sim/contexts' '/b/rootfs/run/gpunode-sim/contexts'" in script
    assert "remount,bind,ro '/b/rootfs/run/gpunode-sim/contexts'" not in script  # contexts are taken there


@pytest.fixture(scope="module")
def hook() -> Path:
    """NVIDIA's nvidia-container-runtime-hook 1.17.8, built here from NVIDIA's module."""
    return toolkit_build.program(toolkit_build.require(SimPaths.from_env().cache)["1.17.8"],
                                 "nvidia-container-runtime-hook")


def run_hook(hook: Path, tmp_path: Path, env: list[str], config: str = "") -> tuple[list[str], str]:
    """Run NVIDIA's hook as runc runs a prestart hook, with a recording cli in place of ours: (its argv, stderr)."""
    bundle = tmp_path / "bundle"
    bundle.mkdir(exist_ok=True)
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                    "process": {"env": env}}))
    record = tmp_path / "argv.json"
    record.unlink(missing_ok=True)
    fake = tmp_path / "cli"
    fake.write_text(f"#!/usr/bin/python3\nimport json, sys\njson.dump(sys.argv, open('{record}', 'w'))\n")
    fake.chmod(0o755)
    settings = tmp_path / "config.toml"
    settings.write_text(f'[nvidia-container-cli]\npath = "{fake}"\nldconfig = "@/sbin/ldconfig"\nload-kmods = true\n'
                        '[nvidia-container-runtime-hook]\nskip-mode-detection = true\n' + config)
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "pid": os.getpid(), "bundle": str(bundle)})
    # runc runs it where containerd's shim runs runc: in the bundle (the hook joins a relative root to it)
    done = subprocess.run([str(hook), f"-config={settings}", "prestart"], input=state, capture_output=True,
                          text=True, timeout=30, check=False, cwd=bundle)
    return (json.loads(record.read_text()) if record.exists() else []), done.stderr


def test_nvidias_hook_passes_what_the_cli_stand_in_reads(hook: Path, tmp_path: Path) -> None:
    """The interface between NVIDIA's real hook and our stand-in, from the real side: the options it parses."""
    argv, stderr = run_hook(hook, tmp_path, ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "NVIDIA_REQUIRE_CUDA=cuda>=12.4",
                                             "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    assert argv, stderr
    assert argv[1:3] == ["--load-kmods", "configure"], argv
    options, rootfs = cli.parse(argv[1:])
    assert rootfs == str(tmp_path / "bundle/rootfs")
    assert options["device"] == ["GPU-a,GPU-b"] and options["require"] == ["cuda>=12.4"], options
    assert options["ldconfig"] == ["@/sbin/ldconfig"] and options["pid"] == [str(os.getpid())], options
    assert "compute" in options and "utility" in options
    none, _ = run_hook(hook, tmp_path, ["PATH=/bin"])  # no NVIDIA_VISIBLE_DEVICES: not a GPU container
    assert none == []


def test_nvidias_hook_drops_the_requirements_when_told_to(hook: Path, tmp_path: Path) -> None:
    argv, stderr = run_hook(hook, tmp_path, ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=13.0",
                                             "NVIDIA_DISABLE_REQUIRE=true"])
    assert argv and not cli.parse(argv[1:])[0].get("require"), (argv, stderr)


def probe_env(tmp_path: Path, modes: list[str]) -> dict[str, str]:
    """A host folder that looks to the workload image's CUDA probe like a container given two GPUs."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev/nvidiactl").write_text("")
    (tmp_path / "contexts").mkdir()
    gpus = [{"index": n, "uuid": f"GPU-{n}aaa", "mig_devices": [{"uuid": f"MIG-{n}bbb"}], "compute_mode": mode}
            for n, mode in enumerate(modes)]
    (tmp_path / "gpu.json").write_text(json.dumps({"node": "node01", "gpus": gpus}, indent=2) + "\n")  # as the node's
    smi = tmp_path / "bin/nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\n" + "".join(f"echo 'GPU {g['index']}: NVIDIA A100 (UUID: {g['uuid']})'\n" for g in gpus))
    smi.chmod(0o755)
    return {"PATH": f"{smi.parent}:{os.environ['PATH']}", "GPUNODE_SIM_DEV": str(tmp_path / "dev"),
            "GPUNODE_SIM_GPU_STATE": str(tmp_path / "gpu.json"), "GPUNODE_SIM_CONTEXTS": str(tmp_path / "contexts")}


def run_probe(tmp_path: Path, env: dict[str, str], *args: str, owner: str = "2 2"):
    probe = tmp_path / "cuda-probe"
    probe.write_text(CUDA_PROBE)
    (tmp_path / "owner-c2").write_text(owner + "\n")
    return subprocess.run(["busybox", "sh", str(probe), *args],
                          env={**env, "GPUNODE_SIM_OWNER": str(tmp_path / "owner-c2")}, capture_output=True,
                          text=True, timeout=30)


BUSY = "CUDA_ERROR_DEVICE_UNAVAILABLE: CUDA-capable device(s) is/are busy or unavailable"


def test_the_cuda_probe_takes_a_context_as_the_gpus_compute_mode_allows(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Default: any number of contexts; Prohibited: none; Exclusive_Process: one at a time across containers,
    freed when its holder exits, or by the cli stand-in once the holder's container is gone."""
    env = probe_env(tmp_path, ["Exclusive_Process", "Default"])
    (tmp_path / "holder").write_text(CUDA_PROBE)
    (tmp_path / "owner-c1").write_text("111 222\n")
    holder = subprocess.Popen(["busybox", "sh", str(tmp_path / "holder"), "30"], text=True,
                              env={**env, "GPUNODE_SIM_OWNER": str(tmp_path / "owner-c1")}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    lock = tmp_path / "contexts/GPU-0aaa"
    deadline = time.monotonic() + 10
    while not (lock / "owner").exists() or not (lock / "owner").read_text():
        assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read()
        time.sleep(0.05)
    assert (lock / "owner").read_text().strip() == "111 222"  # the container's first process, as the cli wrote it
    second = run_probe(tmp_path, env)
    assert second.returncode == 46 and f"cuCtxCreate failed on GPU-0aaa: {BUSY}" in second.stderr, second
    holder.terminate()
    holder.wait(10)
    assert not lock.exists()  # the holder's exit freed it
    third = run_probe(tmp_path, env)
    assert third.returncode == 0 and third.stdout.startswith("CUDA devices: 2\nGPU 0: "), third
    assert not lock.exists()

    # a holder killed before it let go: the next container's configure frees the context of a process gone
    lock.mkdir()
    (lock / "owner").write_text("999999999 1\n")
    assert run_probe(tmp_path, env).returncode == 46
    monkeypatch.setattr(cli, "CONTEXTS", str(tmp_path / "contexts"))
    monkeypatch.setattr(cli, "SELECTED_DIR", str(tmp_path / "containers"))
    cli.free_dead_contexts()
    assert not lock.exists() and run_probe(tmp_path, env).returncode == 0


def test_the_cuda_probe_gets_no_context_on_a_prohibited_gpu_and_no_device_without_one(tmp_path: Path) -> None:
    env = probe_env(tmp_path, ["Default", "Prohibited"])
    refused = run_probe(tmp_path, env)
    assert refused.returncode == 46 and f"cuCtxCreate failed on GPU-1aaa: {BUSY}" in refused.stderr, refused
    (tmp_path / "dev/nvidiactl").unlink()
    none = run_probe(tmp_path, env)
    assert none.returncode == 100 and "CUDA_ERROR_NO_DEVICE" in none.stderr
