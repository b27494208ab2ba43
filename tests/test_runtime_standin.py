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
