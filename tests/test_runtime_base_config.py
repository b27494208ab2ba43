"""When gpunode writes containerd's default config as the base, what the existing config set survives."""

from __future__ import annotations

import tomllib

from gpunode.operations.runtime import keeping_existing, with_systemd_cgroup

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
    merged = keeping_existing(base, EXISTING)
    table = cri(merged)
    assert table["sandbox_image"] == "registry.k8s.io/pause:3.10.1" and table["restrict_oom_score_adj"] is True
    assert table["cni"]["bin_dir"] == "/usr/lib/cni"
    assert table["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True  # the deploy's choice
    assert tomllib.loads(merged)["plugins"]["io.containerd.internal.v1.opt"]["path"] == "/var/lib/containerd/opt"


def test_a_config_of_another_schema_is_not_mixed_in() -> None:
    schema1 = '[plugins.cri]\n  sandbox_image = "mine:1"\n'
    assert keeping_existing(DEFAULT, schema1) == DEFAULT
    assert keeping_existing(DEFAULT, None) == DEFAULT
    assert keeping_existing(DEFAULT, "not [ toml") == DEFAULT
