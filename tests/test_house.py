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


def test_the_chain_is_listed_once_and_each_step_has_its_deploy_fact_diagnosis_and_suite() -> None:
    """gpunode.chain is the one list; the deploy files and the suites named after each step follow it."""
    from pathlib import Path

    from gpunode import chain

    root = Path(__file__).parents[1]
    suites = sorted(p.stem.removeprefix("test_") for p in (root / "src/gpunode/verify/suites").glob("test_*.py"))
    assert suites == sorted(chain.NAMES)
    for folder in (root / "deploys", root / "src/gpunode/scaffold/deploys"):
        assert sorted(p.stem for p in folder.glob("*.py")) == sorted(("bootstrap", *chain.NAMES)), folder
    for step in chain.STEPS:
        assert callable(chain.load(step.deploy))
        if step.on_node:
            assert chain.load(step.fact)().command() and callable(chain.load(step.diagnose))
    source = "\n".join(p.read_text() for p in (root / "src/gpunode").rglob("*.py") if p.name != "chain.py")
    assert '"toolkit_repo", "toolkit"' not in source and "'toolkit_repo', 'toolkit'" not in source
