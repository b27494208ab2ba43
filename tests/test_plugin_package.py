"""The device plugin is its own package: it installs and runs without pyinfra or paramiko."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PLUGIN = Path(__file__).resolve().parents[1] / "plugin"


def test_plugin_declares_no_provisioning_dependencies() -> None:
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    deps = " ".join(project["dependencies"]).lower()
    assert "pyinfra" not in deps and "paramiko" not in deps and "gpunode" not in deps
    assert {d.split(">")[0].split("=")[0] for d in project["dependencies"]} == {
        "grpcio", "protobuf", "nvidia-ml-py", "pyyaml"}
    assert project["scripts"]["gpunode-device-plugin"] == "gpunode_plugin.__main__:main"


def test_plugin_entry_point_runs_without_importing_gpunode_or_pyinfra() -> None:
    code = ("import sys, runpy; sys.argv=['gpunode-device-plugin','--version']\n"
            "import gpunode_plugin.manager, gpunode_plugin.http, gpunode_plugin.nvml_backend\n"
            "try:\n    runpy.run_module('gpunode_plugin', run_name='__main__')\n"
            "except SystemExit: pass\n"
            "bad=[m for m in sys.modules if m.split('.')[0] in ('pyinfra','paramiko','gpunode')]\n"
            "print('imported:', bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert "gpunode-device-plugin 0.1.0" in result.stdout
    assert "imported: []" in result.stdout


def test_image_runs_the_same_entry_point() -> None:
    """The image runs ``python3 -m gpunode_plugin``: the module whose main the console script calls."""
    dockerfile = (PLUGIN / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/python3", "-m", "gpunode_plugin"]' in dockerfile
    project = tomllib.loads((PLUGIN / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["gpunode-device-plugin"] == "gpunode_plugin.__main__:main"
