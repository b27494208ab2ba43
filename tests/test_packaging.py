"""gpunode as a user installs it: wheels built with ``python -m build``, installed into a fresh virtual
environment outside the checkout, driven from a project ``gpunode init`` wrote.

Runs last (tests/conftest.py orders it): its pyinfra bootstrap of the session fleet must find it already
bootstrapped by the other tests and change nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from .conftest import REPO

pytestmark = pytest.mark.fleet


def run(argv: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
        ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_the_plugin_and_simulator_packages_move_with_gpunode() -> None:
    gpunode = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    plugin = tomllib.loads((REPO / "plugin" / "pyproject.toml").read_text())["project"]
    sim = tomllib.loads((REPO / "sim" / "pyproject.toml").read_text())["project"]
    assert gpunode["version"] == plugin["version"] == sim["version"]
    assert gpunode["optional-dependencies"]["sim"] == [f"gpunode-sim=={sim['version']}"]
    assert {f"gpunode=={gpunode['version']}", f"gpunode-device-plugin=={plugin['version']}"} <= set(sim["dependencies"])


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    for source in (REPO, REPO / "plugin", REPO / "sim"):
        built = run([sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(source)], REPO)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, dist: Path) -> Path:
    """A fresh virtual environment with gpunode's wheel alone (no [sim]), outside the checkout."""
    where = tmp_path_factory.mktemp("venv") / "env"
    assert run([sys.executable, "-m", "venv", str(where)], where.parent).returncode == 0
    wheel = next(dist.glob("gpunode-*-py3-none-any.whl"))
    installed = run([str(where / "bin" / "pip"), "install", "-q", str(wheel)], where.parent)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return where


def test_the_wheel_carries_the_templates_and_the_project_files(dist: Path) -> None:
    names = zipfile.ZipFile(next(dist.glob("gpunode-*-py3-none-any.whl"))).namelist()
    assert "gpunode/templates/device-plugin.yaml.j2" in names
    assert "gpunode/scaffold/deploys/bootstrap.py" in names
    assert "gpunode/scaffold/inventories/group_data/all.py" in names
    assert not [n for n in names if n.startswith("gpunode/sim/")]  # the simulator is a distribution of its own
    assert list(dist.glob("gpunode-*.tar.gz")) and list(dist.glob("gpunode_device_plugin-*.whl"))
    sim = zipfile.ZipFile(next(dist.glob("gpunode_sim-*.whl"))).namelist()
    assert "gpunode_sim/spec/profile_files/a100x4-containerd.yaml" in sim
    assert "gpunode_sim/standins/nvidia_smi.py" in sim


def test_an_installed_gpunode_works_from_a_project_of_its_own(venv: Path, tmp_path: Path) -> None:
    gpunode = str(venv / "bin" / "gpunode")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    version = run([gpunode, "--version"], tmp_path, env)
    assert version.returncode == 0 and "0.1.0" in version.stdout
    init = run([gpunode, "init", "fleet"], tmp_path, env)
    assert init.returncode == 0 and "wrote fleet/deploys/bootstrap.py" in init.stdout, init.stderr
    project = tmp_path / "fleet"
    again = run([gpunode, "init", "fleet"], tmp_path, env)
    assert "kept  fleet/inventories/prod.py (exists; --force overwrites it)" in again.stdout
    rendered = run([gpunode, "render", "inventories/prod.py"], project, env)
    assert rendered.returncode == 0, rendered.stderr
    assert "kind: DaemonSet" in rendered.stdout and "Traceback" not in rendered.stderr
    own = project / "templates"
    own.mkdir()
    (own / "device-plugin.yaml.j2").write_text("# {{ namespace }} from my own template\n")
    overridden = run([gpunode, "render", "inventories/prod.py", "--data", "templates_dir=templates"], project, env)
    assert overridden.stdout.startswith("# gpunode-system from my own template"), overridden.stdout + overridden.stderr
    (project / "pod.yaml").write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n"
                                      "    - name: c\n      image: cuda\n      resources:\n"
                                      "        requests: {nvidia.com/gpu: 1}\n")
    lint = run([gpunode, "lint", "pod.yaml"], project, env)
    assert lint.returncode == 1 and "Limit must be set for non overcommitable resources" in lint.stdout
    sim = run([gpunode, "sim", "status"], project, env)
    assert sim.returncode == 1 and "Traceback" not in sim.stderr
    assert "pip install 'gpunode[sim]'" in sim.stderr, sim.stderr


def test_with_the_sim_extra_it_drives_the_simulated_fleet(fleet: dict, venv: Path, dist: Path,
                                                         tmp_path: Path) -> None:
    pip = str(venv / "bin" / "pip")
    wheel = next(dist.glob("gpunode-*-py3-none-any.whl"))
    extra = run([pip, "install", "-q", "--find-links", str(dist), f"{wheel}[sim]"], tmp_path)
    assert extra.returncode == 0, extra.stderr[-3000:]
    env = {k: v for k, v in fleet["env"].items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    status = run(["gpunode", "sim", "status", "--json"], tmp_path, env)
    assert status.returncode == 0 and len(json.loads(status.stdout)) == 3, status.stderr
    assert run(["gpunode", "init", "fleet", "--sim"], tmp_path, env).returncode == 0
    project = tmp_path / "fleet"
    dry = run(["gpunode", "deploy", "inventories/sim.py", "--dry"], project, env)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]  # the other tests left it bootstrapped
    assert (project / "reports" / "gpunode-deploy-report.json").is_file()
    bootstrap = run(["pyinfra", "-y", "inventories/sim.py", "deploys/bootstrap.py"], project, env)
    assert bootstrap.returncode == 0, bootstrap.stdout[-3000:] + bootstrap.stderr[-3000:]
    assert not list(REPO.glob("gpunode-deploy-report.json"))


def test_from_a_fresh_venv_the_image_is_built_and_pushed_to_the_fleets_registry(
        fleet: dict, venv: Path, dist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``gpunode image build`` and ``gpunode image push`` with gpunode's wheel alone: the plugin's wheel in, the
    same bytes as the image the fleet runs out (its dependencies constrained to the versions the tests ran), pushed
    to the fleet's registry with the registry's CA and user."""
    from gpunode_sim.host.paths import SimPaths
    from gpunode_sim.images import plugin_image
    from gpunode_sim.registry import server

    env = {k: v for k, v in fleet["env"].items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    inventory = json.loads((Path(fleet["env"]["GPUNODE_SIM_DIR"]) / "inventory.json").read_text())
    digest = inventory["plugin"]["plugin_image"].split("@")[1]
    pins = tmp_path / "pins.txt"
    pins.write_text("".join(f"{pin}\n" for pin in plugin_image.installed_versions()))
    wheel = next(dist.glob("gpunode_device_plugin-*.whl"))
    cache = Path(os.environ.get("GPUNODE_CACHE_DIR", "/var/cache/gpunode"))  # the base layer the fleet's build made
    built = run([str(venv / "bin" / "gpunode"), "image", "build", "--plugin", str(wheel), "--cache", str(cache),
                 "--constraint", str(pins), "--out", str(tmp_path / "image")], tmp_path, env)
    assert built.returncode == 0, built.stderr[-3000:]
    assert f"gpunode-device-plugin:0.1.0  {digest}" in built.stdout, (built.stdout, digest)
    for name in ("GPUNODE_SIM_DIR", "GPUNODE_SIM_NET"):
        monkeypatch.setenv(name, fleet["env"][name])
    reach = server.access(SimPaths.from_env())
    reference = f"{reach.push_host}/gpunode/device-plugin:from-a-fresh-venv"
    pushed = run([str(venv / "bin" / "gpunode"), "image", "push", reference, "--archive",
                  str(tmp_path / "image" / "image.tar"), "--cert-dir", str(reach.cert_dir), "--username",
                  reach.username], tmp_path, {**env, "GPUNODE_REGISTRY_PASSWORD": reach.password})
    assert pushed.returncode == 0 and f"pushed {reference}: {digest}" in pushed.stdout, pushed.stderr[-2000:]

