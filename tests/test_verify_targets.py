"""The ssh_config the verification writes: what OpenSSH itself makes of it (``ssh -G``), no connection made."""

from __future__ import annotations

import subprocess
from pathlib import Path

import paramiko

from gpunode.verify.targets import Target, ssh_config_for


def effective(config: str, host: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "ssh_config"
    path.write_text(config)
    out = subprocess.run(["ssh", "-G", "-F", str(path), host], capture_output=True, text=True, check=True,
                         timeout=30).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def test_openssh_reaches_a_host_as_pyinfra_does(tmp_path: Path):
    target = Target("node01", {"ssh_hostname": "127.0.30.1", "ssh_port": 2222, "ssh_user": "root",
                               "ssh_key": "/keys/id_ed25519", "ssh_known_hosts_file": "/keys/known_hosts",
                               "ssh_strict_host_key_checking": "yes"}, ["gpu_nodes"])
    settings = effective(ssh_config_for([target]), "node01", tmp_path)
    assert settings["hostname"] == "127.0.30.1"
    assert settings["port"] == "2222"
    assert settings["user"] == "root"
    assert settings["userknownhostsfile"] == "/keys/known_hosts"
    assert settings["stricthostkeychecking"] == "true"
    assert settings["batchmode"] == "yes"
    # the key exchanges are the deploy's (paramiko's, in its order), never SHA-1, never OpenSSH's costly default
    kex = settings["kexalgorithms"].split(",")
    offered = [name for name in paramiko.Transport._preferred_kex if "sha1" not in name]
    assert kex[0] == offered[0]
    assert kex == [name for name in offered if name in kex]
    assert not any("sntrup" in name or "sha1" in name for name in kex)
