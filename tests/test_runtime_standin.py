"""The nvidia-container-runtime stand-in fails where NVIDIA's hook fails, with nvidia-container-cli's words."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SOURCE = Path(__file__).parents[1] / "sim/gpunode_sim/standins/nvidia_container_runtime.py"
spec = importlib.util.spec_from_file_location("runtime_standin", SOURCE)
standin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(standin)

DRIVER = {"cuda_version": "12.4", "driver_version": "550.54.15"}


@pytest.mark.parametrize(("env", "refused"), [
    ({}, None),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}, None),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.6"}, "cuda>=12.6"),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.6", "NVIDIA_DISABLE_REQUIRE": "true"}, None),
    # a CUDA image's forward-compatibility alternatives: space-separated groups, any one suffices
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.6 brand=tesla,driver>=550,driver<551"}, "cuda>=12.6"),  # brand not simulated
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=12.6 driver>=550,driver<551"}, None),
    ({"NVIDIA_REQUIRE_CUDA": "cuda>=11.0 driver>=560"}, None),
])
def test_require_cuda_is_judged_against_the_driver(env: dict, refused: str | None) -> None:
    if refused is None:
        standin.check_require(env, DRIVER)
        return
    with pytest.raises(standin.HookFailed) as caught:
        standin.check_require(env, DRIVER)
    assert str(caught.value) == (f"nvidia-container-cli: requirement error: unsatisfied condition: {refused}, please "
                                 "update your driver to a newer version, or use an earlier cuda container")


def test_a_missing_ldconfig_fails_with_the_hooks_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.toml"
    monkeypatch.setattr(standin, "CONFIG", str(config))
    standin.check_config()  # no file: nvidia-ctk's defaults
    config.write_text('[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n')
    standin.check_config()
    config.write_text('[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig.gone"\n')
    with pytest.raises(standin.HookFailed, match="^nvidia-container-cli: ldcache error: open failed: "
                                                  "/sbin/ldconfig.gone: no such file or directory$"):
        standin.check_config()


def test_a_failed_hook_is_written_where_containerd_reads_runc_s_error(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    with pytest.raises(SystemExit) as caught:
        standin.fail_as_runc(["--root", "/run/x", "--log", str(log), "create", "id"], standin.HookFailed("boom"))
    assert caught.value.code == 1
    assert '"msg": "runc create failed: unable to start container process: error during container init: error ' \
           'running hook #0: error running hook: exit status 1, stdout: , stderr: boom"' in log.read_text()


def probe_env(tmp_path: Path, modes: list[str]) -> dict[str, str]:
    """A host folder that looks to the workload image's CUDA probe like a container given two GPUs."""
    import json
    import os

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


def run_probe(tmp_path: Path, env: dict[str, str], *args: str, container: str = "c2"):
    import subprocess

    from gpunode_sim.images.workload_image import CUDA_PROBE

    probe = tmp_path / "cuda-probe"
    probe.write_text(CUDA_PROBE)
    return subprocess.run(["busybox", "sh", str(probe), *args], env={**env, "GPUNODE_SIM_CONTAINER": container},
                          capture_output=True, text=True, timeout=30)


BUSY = "CUDA_ERROR_DEVICE_UNAVAILABLE: CUDA-capable device(s) is/are busy or unavailable"


def test_the_cuda_probe_takes_a_context_as_the_gpus_compute_mode_allows(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Default: any number of contexts; Prohibited: none; Exclusive_Process: one at a time across containers,
    freed when its holder exits, or by the runtime when the holder's container is deleted."""
    import subprocess
    import time

    env = probe_env(tmp_path, ["Exclusive_Process", "Default"])
    from gpunode_sim.images.workload_image import CUDA_PROBE

    (tmp_path / "holder").write_text(CUDA_PROBE)
    holder = subprocess.Popen(["busybox", "sh", str(tmp_path / "holder"), "30"], text=True,
                              env={**env, "GPUNODE_SIM_CONTAINER": "c1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
    lock = tmp_path / "contexts/GPU-0aaa"
    deadline = time.monotonic() + 10
    while not (lock / "owner").exists():
        assert time.monotonic() < deadline and holder.poll() is None, holder.stderr.read()
        time.sleep(0.05)
    assert (lock / "owner").read_text().strip() == "c1"
    second = run_probe(tmp_path, env)
    assert second.returncode == 46 and f"cuCtxCreate failed on GPU-0aaa: {BUSY}" in second.stderr, second
    holder.terminate()
    holder.wait(10)
    assert not lock.exists()  # the holder's exit freed it
    third = run_probe(tmp_path, env)
    assert third.returncode == 0 and third.stdout.startswith("CUDA devices: 2\nGPU 0: "), third
    assert not lock.exists()

    # a holder killed before it let go: its container's delete frees the context (the runtime's "delete")
    lock.mkdir()
    (lock / "owner").write_text("c1\n")
    assert run_probe(tmp_path, env).returncode == 46
    monkeypatch.setattr(standin, "CONTEXTS", str(tmp_path / "contexts"))
    standin.release_contexts("c9")  # another container's delete: not its lock
    assert lock.exists()
    standin.release_contexts("c1")
    assert not lock.exists() and run_probe(tmp_path, env).returncode == 0


def test_the_cuda_probe_gets_no_context_on_a_prohibited_gpu_and_no_device_without_one(tmp_path: Path) -> None:
    env = probe_env(tmp_path, ["Default", "Prohibited"])
    refused = run_probe(tmp_path, env)
    assert refused.returncode == 46 and f"cuCtxCreate failed on GPU-1aaa: {BUSY}" in refused.stderr, refused
    (tmp_path / "dev/nvidiactl").unlink()
    none = run_probe(tmp_path, env)
    assert none.returncode == 100 and "CUDA_ERROR_NO_DEVICE" in none.stderr
