"""Bad hosts get one clear line naming the missing piece, and nothing is created."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from gpunode_sim.guest import systemctl
from gpunode_sim.host import prereqs

from gpunode.cli import main
from gpunode.errors import GpunodeError
from gpunode.image.mirror import debian_mirror


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


def test_up_as_non_root_says_so_and_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("GPUNODE_SIM_DIR", str(state))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(sys, "argv", ["gpunode", "sim", "up"])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "gpunode: the simulated fleet needs root (namespaces, overlay mounts, mknod)"
    assert "Traceback" not in err
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
