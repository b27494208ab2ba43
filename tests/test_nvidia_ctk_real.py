"""The ``nvidia-ctk`` the simulated toolkit packages carry is the real one: built here, it writes what the
captures of NVIDIA's own builds of 1.17.8 and 1.20.0 say.

Every case captured in ``tests/fixtures/nvidia-ctk`` is replayed against the binary built from NVIDIA's Go
module (``gpunode sim build``); the written TOML/JSON must be byte for byte what was captured, and the exit
code and log messages must match.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
from gpunode_sim.build import toolkit_build
from gpunode_sim.host.paths import SimPaths

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia-ctk"
CASES = sorted(p for p in FIXTURES.glob("v*/*") if p.is_dir() and (p / "cmd").exists())


def messages(stderr: str) -> list[str]:
    return re.findall(r'level=(\w+) msg="((?:[^"\\]|\\.)*)"', stderr)


@pytest.fixture(scope="module")
def binaries() -> dict[str, Path]:
    return toolkit_build.require(SimPaths.from_env().cache)


def test_fixtures_are_present() -> None:
    assert len(CASES) >= 60, f"expected the shared nvidia-ctk fixtures under {FIXTURES}"


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_case_matches_real_tool(case: Path, binaries: dict[str, Path], tmp_path: Path) -> None:
    version = case.parent.name.lstrip("v")
    cmd_line = (case / "cmd").read_text().strip()
    command, _, comment = cmd_line.partition("#")
    source = comment.split("input:")[1].strip()
    argv = shlex.split(command)[1:]
    runtime = "docker" if "--runtime=docker" in argv else "containerd"
    etc = tmp_path / "etc"
    main_name = "daemon.json" if runtime == "docker" else "config.toml"
    main_dir = etc / ("docker" if runtime == "docker" else "containerd")
    main_dir.mkdir(parents=True)
    main_file = main_dir / main_name
    if source != "-":
        main_file.write_bytes((FIXTURES / "inputs" / source).read_bytes())

    def relocate(arg: str) -> str:
        return arg.replace("=/etc/", f"={etc}/")

    argv = [relocate(a) for a in argv]
    if version != "1.17.8" and runtime == "containerd" and not any(a.startswith("--drop-in-config") for a in argv):
        argv.append(f"--drop-in-config={etc}/containerd/conf.d/99-nvidia.toml")

    runs = 2 if (case / "rc2").exists() else 1
    for run in range(1, runs + 1):
        suffix = "" if run == 1 else str(run)
        result = subprocess.run([str(binaries[version]), *argv], capture_output=True, text=True)
        assert result.returncode == int((case / f"rc{suffix}").read_text()), result.stderr
        expected_msgs = messages((case / f"stderr{suffix}").read_text())
        got = [(lvl, msg.replace(str(etc), "/etc")) for lvl, msg in messages(result.stderr)]
        assert got == expected_msgs

    files = case / "files"
    expected_main = files / main_name
    if expected_main.exists() and expected_main.stat().st_size:
        assert main_file.exists()
        got_main = main_file.read_text().replace(str(etc), "/etc")
        assert got_main == expected_main.read_text()
    dropin = files / "etc" / "containerd" / "conf.d" / "99-nvidia.toml"
    got_dropin = etc / "containerd" / "conf.d" / "99-nvidia.toml"
    assert got_dropin.exists() == dropin.exists()
    if dropin.exists():
        assert got_dropin.read_text().replace(str(etc), "/etc") == dropin.read_text()
