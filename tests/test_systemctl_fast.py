"""The simulated nodes' ``systemctl is-active`` fast path answers exactly as the full stand-in does.

The full stand-in (docker-systemctl-replacement, patched as the nodes run it) and the fast path each read one
unit tree built here (``--root`` for the one, GPUNODE_SIM_SYSTEMCTL_ROOT for the other); every unit state the
fast path claims to know must give the same lines and exit code, and every case it does not know must go to
the full stand-in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpunode_sim.guest import systemctl
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.repos.aptrepo import render_standin

UNIT = ("[Unit]\nDescription={name}\n[Service]\nExecStart=/bin/sleep 600\n{extra}\n"
        "[Install]\nWantedBy=multi-user.target\n")


@pytest.fixture(scope="module")
def full_standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("systemctl")
    for name, text in systemctl.fetch(SimPaths.from_env().cache / "wheels").items():
        (folder / name).write_text(text)
    return folder / "systemctl3.py"


@pytest.fixture
def processes() -> Iterator[dict[str, int]]:
    """A live process, a zombie (exited, not reaped) and the pid of one that has ended."""
    live = subprocess.Popen(["sleep", "600"])
    zombie = subprocess.Popen(["true"])
    ended = subprocess.Popen(["true"])
    ended.wait()
    for _ in range(100):  # until the zombie has exited
        if "Z" in next(line for line in Path(f"/proc/{zombie.pid}/status").read_text().splitlines()
                       if line.startswith("State:")):
            break
        subprocess.run(["sleep", "0.02"], check=True)
    yield {"live": live.pid, "zombie": zombie.pid, "ended": ended.pid}
    live.kill()
    live.wait()
    zombie.wait()


def unit_tree(root: Path, pids: dict[str, int]) -> None:
    lib, etc, run = root / "lib/systemd/system", root / "etc/systemd/system", root / "run"
    for folder in (lib, etc, run, root / "etc/init.d"):
        folder.mkdir(parents=True, exist_ok=True)
    units = {
        "running": (lib, "", f"MainPID={pids['live']}\n"),
        "crashed": (lib, "", f"MainPID={pids['ended']}\n"),
        "zombied": (lib, "", f"MainPID={pids['zombie']}\n"),
        "failedstart": (lib, "", f"ActiveState=failed\nMainPID={pids['live']}\n"),
        "stated": (lib, "", "ActiveState=active\n"),
        "stopped": (lib, "", None),
        "emptystatus": (lib, "", ""),
        "zeropid": (lib, "", "MainPID=0\n"),
        "spaced": (lib, "", f"MainPID= {pids['live']} \n"),
        "overridden": (etc, "", f"MainPID={pids['live']}\n"),
        "pidfile": (lib, "PIDFile=/run/pidfile.pid", None),
        "statusfile": (lib, "StatusFile=/run/elsewhere", None),
        "badpid": (lib, "", "MainPID=abc\n"),
        "paddedpid": (lib, "", f"MainPID=0{pids['live']}\n"),
        "withdropin": (lib, "", f"MainPID={pids['live']}\n"),
    }
    for name, (folder, extra, status) in units.items():
        (folder / f"{name}.service").write_text(UNIT.format(name=name, extra=extra))
        if status is not None:
            (run / f"{name}.service.status").write_text(status)
    (lib / "overridden.service").write_text(UNIT.format(name="overridden", extra=""))
    (lib / "withdropin.service.d").mkdir()
    (lib / "withdropin.service.d/override.conf").write_text("[Service]\nPIDFile=/run/x.pid\n")
    (lib / "runningdropin.service").write_text(UNIT.format(name="runningdropin", extra=""))
    (run / "runningdropin.service.status").write_text(f"MainPID={pids['live']}\n")
    (etc / "runningdropin.service.d").mkdir()  # as docker's on the simulated nodes: ExecStart only
    (etc / "runningdropin.service.d/gpunode-sim.conf").write_text("[Service]\nExecStart=\nExecStart=/bin/true\n")
    (etc / "runningdropin.service.d/notes.txt").write_text("PIDFile=/run/ignored.pid (not a .conf)\n")
    (lib / "linkeddropin.service").write_text(UNIT.format(name="linkeddropin", extra=""))
    (etc / "linkeddropin.service.d").mkdir()
    (etc / "linkeddropin.service.d/x.conf").symlink_to(lib / "withdropin.service.d/override.conf")
    (lib / "aliased.service").symlink_to("running.service")
    (root / "etc/init.d/legacy").write_text("#!/bin/sh\n")


def full(script: Path, root: Path, *units: str) -> tuple[str, str, int]:
    result = subprocess.run([sys.executable, str(script), f"--root={root}", "is-active", *units],
                            capture_output=True, text=True, check=False)
    return result.stdout, result.stderr, result.returncode


def fast(tmp_path: Path, root: Path, *args: str) -> tuple[str, str, int]:
    script, marker = tmp_path / "systemctl", tmp_path / "full-standin"
    script.write_text(render_standin("systemctl_fast.sh"))
    marker.write_text('#!/bin/sh\necho "full stand-in: $*"\n')
    marker.chmod(0o755)
    result = subprocess.run(["sh", str(script), *args], capture_output=True, text=True, check=False,
                            env={**os.environ, "GPUNODE_SIM_SYSTEMCTL_ROOT": str(root),
                                 "GPUNODE_SIM_SYSTEMCTL": str(marker)})
    return result.stdout, result.stderr, result.returncode


@pytest.mark.parametrize("units", [
    ["running"], ["crashed"], ["zombied"], ["failedstart"], ["stated"], ["stopped"], ["emptystatus"],
    ["zeropid"], ["spaced"], ["overridden"], ["missing"], ["running.service"], ["runningdropin"],
    ["running", "missing", "stopped"],  # the deploy's own call: containerd docker crio
    ["running", "overridden"],
])
def test_the_fast_path_answers_as_the_full_standin(tmp_path: Path, full_standin: Path, processes: dict[str, int],
                                                    units: list[str]) -> None:
    root = tmp_path / "root"
    unit_tree(root, processes)
    expected = full(full_standin, root, *units)
    answered = fast(tmp_path, root, "is-active", *units)
    assert not answered[0].startswith("full stand-in"), answered
    assert answered == expected


@pytest.mark.parametrize("args", [
    ["is-active", "pidfile"], ["is-active", "statusfile"], ["is-active", "withdropin"], ["is-active", "aliased"],
    ["is-active", "linkeddropin"],
    ["is-active", "legacy"], ["is-active", "badpid"], ["is-active", "paddedpid"], ["is-active", "running", "pidfile"],
    ["is-active", "--quiet", "running"], ["is-active", "run*"], ["is-active", "ssh.socket"], ["is-active"],
    ["status", "running"], ["restart", "running"],
])
def test_what_it_does_not_know_goes_to_the_full_standin(tmp_path: Path, processes: dict[str, int],
                                                         args: list[str]) -> None:
    root = tmp_path / "root"
    unit_tree(root, processes)
    assert fast(tmp_path, root, *args) == (f"full stand-in: {' '.join(args)}\n", "", 0)
