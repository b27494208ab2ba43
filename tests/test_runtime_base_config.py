"""When gpunode writes containerd's default config as the base, what the existing config set survives."""

from __future__ import annotations

import tomllib
from pathlib import Path

from gpunode.operations.runtime import carried_settings, keeping_existing, with_systemd_cgroup

DEFAULT = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.6"
    restrict_oom_score_adj = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/opt/cni/bin"
      conf_dir = "/etc/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
"""
# Debian 12's config plus what an admin set: no runc runtime, so gpunode needs a full base
EXISTING = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


def cri(text: str) -> dict:
    return tomllib.loads(text)["plugins"]["io.containerd.grpc.v1.cri"]


def test_the_admins_settings_are_laid_over_the_default() -> None:
    base = with_systemd_cgroup(DEFAULT, True)
    assert base is not None
    merged = keeping_existing(base, carried_settings(EXISTING, DEFAULT))
    table = cri(merged)
    assert table["sandbox_image"] == "registry.k8s.io/pause:3.10.1" and table["restrict_oom_score_adj"] is True
    assert table["cni"]["bin_dir"] == "/usr/lib/cni"
    assert table["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # the deploy's choice
    assert tomllib.loads(merged)["plugins"]["io.containerd.internal.v1.opt"]["path"] == "/var/lib/containerd/opt"


def test_a_config_of_another_schema_is_not_mixed_in_without_containerds_migration() -> None:
    schema1 = '[plugins.cri]\n  sandbox_image = "mine:1"\n'
    assert carried_settings(schema1, DEFAULT) == {}
    assert keeping_existing(DEFAULT, carried_settings(schema1, DEFAULT)) == DEFAULT
    assert carried_settings(None, DEFAULT) == {} and carried_settings("not [ toml", DEFAULT) == {}
    assert carried_settings(EXISTING, DEFAULT, migrated="not [ toml") == carried_settings(EXISTING, DEFAULT)


FIXTURES = Path(__file__).parent / "fixtures"
# containerd 2.1.9 (Debian unstable): its default config (schema 3), Debian's packaged schema-2 config with the
# simulator's CRI settings, and what 'containerd config migrate' made of that file (captured on the node)
DEFAULT_21 = (FIXTURES / "nvidia-ctk/inputs/containerd-2.1.9-default.toml").read_text()
STUB_21 = (FIXTURES / "containerd/debian-stub-with-cri-settings.toml").read_text()
MIGRATED_21 = (FIXTURES / "containerd/2.1.9-migrate-of-debian-stub.toml").read_text()


def test_on_containerd_2_a_schema_2_config_is_carried_through_containerds_own_migration() -> None:
    carried = carried_settings(STUB_21, DEFAULT_21, MIGRATED_21)
    base = with_systemd_cgroup(DEFAULT_21, True)
    assert base is not None
    merged = tomllib.loads(keeping_existing(base, carried))
    assert merged["version"] == 3
    plugins = merged["plugins"]
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.10.1"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"]["bin_dirs"] == ["/usr/lib/cni"]
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # the deploy's choice
    assert "io.containerd.grpc.v1.cri" not in plugins or "sandbox_image" not in plugins["io.containerd.grpc.v1.cri"]


def test_only_what_the_migration_sets_apart_from_the_defaults_is_carried() -> None:
    carried = carried_settings(STUB_21, DEFAULT_21, MIGRATED_21)
    runtime = carried["plugins"]["io.containerd.cri.v1.runtime"]
    assert "containerd" not in runtime  # runc's options are containerd's defaults: the inventory's SystemdCgroup wins
    images = carried["plugins"]["io.containerd.cri.v1.images"]
    assert images == {"pinned_images": {"sandbox": "registry.k8s.io/pause:3.10.1"}}
    assert "version" not in carried
