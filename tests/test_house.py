"""How the product is put together: what imports what, and what a pytest run in the same environment gets."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata


def test_doctor_does_not_import_pytest() -> None:
    """The verify engine is a library: doctor judges the same facts without pytest in the process."""
    probe = ("import sys, gpunode.doctor; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest')))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_verify_plugin_is_not_registered_for_every_pytest_run() -> None:
    """No pytest11 entry point: only gpunode's own runs (``-p gpunode.verify.plugin``) get --inventory."""
    assert not [e for e in metadata.entry_points(group="pytest11") if e.value.startswith("gpunode")]
    result = subprocess.run([sys.executable, "-m", "pytest", "--help"], capture_output=True, text=True, check=False)
    assert "--inventory" not in result.stdout
