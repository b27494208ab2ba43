"""Verification over a local connection (``@local``), as on a GPU host itself: this machine has no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def verify_local(tmp_path: Path, gpu_required: bool) -> tuple[subprocess.CompletedProcess[str], dict]:
    inventory = tmp_path / "local.py"
    # the node steps only: no cluster here (tests/test_rollout.py covers the cluster steps)
    inventory.write_text(f"hosts = [('@local', {{'gpu_required': {gpu_required}, 'cluster_steps': False}})]\n")
    out = tmp_path / "verify.json"
    # run outside the checkout: the suites come from the installed package
    result = subprocess.run([sys.executable, "-m", "gpunode.cli", "verify", str(inventory), "--json", str(out)],
                            cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    return result, json.loads(out.read_text()) if out.exists() else {}


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this machine has an NVIDIA driver")
def test_a_host_without_gpu_is_skipped_or_failed_as_the_inventory_says(tmp_path: Path) -> None:
    result, results = verify_local(tmp_path, gpu_required=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert results["hosts"]["@local"]["driver"]["state"] == "not checked"
    labels = results["hosts"]["@local"]["labels"]
    assert (labels["state"], labels["reason"]) == ("not checked", "cluster_steps = False")
    assert "CPU-only host" in result.stdout
    required, results = verify_local(tmp_path, gpu_required=True)
    assert required.returncode == 1
    assert results["hosts"]["@local"]["driver"]["reason"].startswith("no NVIDIA driver is installed")
    assert results["hosts"]["@local"]["toolkit"] == {"state": "not checked", "proof": [],
                                                     "reason": "the driver step failed", "findings": []}
