"""Bad hosts get one clear line naming the missing piece, and nothing is created."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpunode.errors import GpunodeError
from gpunode.sim import prereqs, systemctl
from gpunode.sim.mirror import debian_mirror


def test_missing_tool_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "debootstrap" else "/usr/bin/" + tool)
    with pytest.raises(GpunodeError) as error:
        prereqs.check_host()
    assert error.value.problem == "debootstrap is not installed"
    assert "apt-get install debootstrap" in str(error.value.fix)


def test_kernel_without_overlayfs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: "/usr/bin/" + tool)
    filesystems = tmp_path / "filesystems"
    filesystems.write_text("nodev\tsysfs\nnodev\ttmpfs\n\text4\n")
    with pytest.raises(GpunodeError, match="no overlayfs"):
        prereqs.check_host(filesystems)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_up_as_non_root_says_so_and_creates_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    tmp_path.chmod(0o777)
    env = {**os.environ, "GPUNODE_SIM_DIR": str(state), "GPUNODE_SIM_NET": "23", "HOME": str(tmp_path)}
    result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                             sys.executable, "-m", "gpunode.cli", "sim", "up"],
                            capture_output=True, text=True, env=env, check=False)
    assert result.returncode == 1
    assert "gpunode: the simulated fleet needs root" in result.stderr
    assert "Traceback" not in result.stderr
    assert not state.exists()


def test_mirror_is_read_from_the_hosts_apt_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://security.invalid/debian-security\nSuites: bookworm-security\n")
    assert debian_mirror(tmp_path) == "http://mirror.invalid/debian"
    (tmp_path / "sources.list.d" / "debian.sources").unlink()
    (tmp_path / "sources.list").write_text("# comment\ndeb [arch=amd64] http://old.invalid/debian bookworm main\n")
    assert debian_mirror(tmp_path) == "http://old.invalid/debian"
    (tmp_path / "sources.list").write_text("deb http://old.invalid/debian bullseye main\n")
    with pytest.raises(GpunodeError, match="no Debian bookworm mirror"):
        debian_mirror(tmp_path)


def test_systemctl_patches_refuse_a_changed_release() -> None:
    with pytest.raises(GpunodeError, match="does not apply"):
        systemctl.patch_source("print('not the pinned release')\n")


def test_systemctl_patches_apply_once_each() -> None:
    text = "".join(old for _why, old, _new in systemctl.PATCHES)
    patched = systemctl.patch_source(text)
    assert all(new in patched for _why, _old, new in systemctl.PATCHES)
    assert "time.sleep(1) # until TimeoutStopSec" not in patched
