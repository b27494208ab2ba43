"""The node images per Debian release: where each lives, what it installs, and the CRI settings per schema."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from gpunode_sim.host.paths import SimPaths
from gpunode_sim.images import layers

FIXTURES = Path(__file__).parent / "fixtures"


def test_each_release_has_its_own_base_and_layers_and_debian_12_keeps_its_folders(tmp_path: Path) -> None:
    paths = SimPaths(tmp_path / "state", tmp_path / "cache")
    assert layers.base_rootfs(paths, "debian12") == paths.base_rootfs
    assert layers.layer_dir(paths, "debian12", "containerd") == paths.layer("containerd")
    lowers = layers.lower_dirs(paths, "debian-unstable", "docker")
    assert lowers == [paths.layer("tools"), paths.layer("debian-unstable-docker"),
                      paths.layer("debian-unstable-containerd"), paths.layer("debian-unstable-sim"),
                      tmp_path / "state/base-debian-unstable/rootfs"]


def test_a_layers_digest_names_its_release() -> None:
    digests = {suite: layers._layer_digest("containerd", suite) for suite in ("bookworm", "trixie", "sid")}
    assert len(set(digests.values())) == 3
    assert layers._layer_digest("containerd") == digests["bookworm"]


def test_unstables_docker_layer_brings_the_client_its_package_only_recommends() -> None:
    assert layers.layer_packages("docker", "sid") == ("docker.io", "docker-cli")
    assert layers.layer_packages("docker", "bookworm") == ("docker.io",)


def test_cri_settings_go_where_each_schema_keeps_them(tmp_path: Path) -> None:
    schema3 = tmp_path / "v3.toml"
    schema3.write_text((FIXTURES / "nvidia-ctk/inputs/containerd-2.1.9-default.toml").read_text())
    layers._set_cri_settings(schema3)
    plugins = tomllib.loads(schema3.read_text())["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10.1"
    assert plugins["io.containerd.cri.v1.runtime"]["restrict_oom_score_adj"] is True
    assert "io.containerd.grpc.v1.cri" not in plugins or "sandbox_image" not in plugins["io.containerd.grpc.v1.cri"]
    schema2 = tmp_path / "v2.toml"
    schema2.write_text((FIXTURES / "nvidia-ctk/inputs/debian-packaged-config.toml").read_text())
    layers._set_cri_settings(schema2)
    cri = tomllib.loads(schema2.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.10.1" and cri["restrict_oom_score_adj"] is True
    assert cri["cni"]["bin_dir"] == "/usr/lib/cni"  # Debian's own settings kept


def test_a_fleet_without_debian_12_nodes_still_gets_the_bastions_image(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: a fleet of Debian 13 nodes only failed at the bastion ("special device overlay does not exist")."""
    prepared: list[str] = []
    monkeypatch.setattr(layers, "_cached", lambda paths, name, digest, target, build, say: prepared.append(name))
    layers.prepare_images(SimPaths(tmp_path / "state", tmp_path / "cache"), {("debian13", "containerd")},
                          lambda line: None)
    assert {"base-bookworm", "layer-sim", "base-trixie", "layer-sim-debian13", "layer-containerd-debian13"} <= set(
        prepared), prepared
    assert "layer-containerd" not in prepared  # Debian 12's runtime layer: no node needs it
