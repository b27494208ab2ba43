"""The one facts command a no-op asks each host: GPU steps' parts only where an NVIDIA driver left a trace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpunode.facts.node import FACTS, facts_command, split_facts


def answer(env: dict[str, str]) -> dict[str, object]:
    result = subprocess.run(["sh", "-c", facts_command()], capture_output=True, text=True, env=env, check=False,
                            timeout=60)
    return split_facts(result.stdout)


def test_a_host_without_a_driver_is_asked_only_the_driver_check_and_its_name():
    if any(Path(p).exists() for p in ("/proc/driver/nvidia", "/sys/module/nvidia", "/dev/nvidiactl")):
        pytest.skip("this machine has an NVIDIA driver: it answers every step (the next test's case)")
    env = {**os.environ, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    parts = answer(env)
    assert set(parts) == {"driver", "hostname"}
    assert parts["driver"]["nvidia_smi"]["rc"] == 127  # the driver check still sees "no nvidia-smi"


def test_a_host_with_nvidia_smi_is_asked_every_step(tmp_path: Path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'"
                   "\nexit 9\n")
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"}
    parts = answer(env)
    assert set(parts) == set(FACTS)
    assert parts["driver"]["nvidia_smi"]["rc"] == 9
