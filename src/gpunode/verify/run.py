"""``gpunode verify``: the engine's verdicts, then the table and the reports CI keeps.

The verdicts are the engine's (``gpunode.verify.engine``, or ``gpunode.verify.in_cluster`` with ``--in-cluster``):
every host read once, in parallel. The pytest suites (``gpunode.verify.suites``) run over those same verdicts
only when a JUnit report is asked for: JUnit is pytest's, and pytest's own cost (a few milliseconds per host and
step) is otherwise the larger part of an in-cluster verify at a hundred nodes.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode.verify import report
from gpunode.verify.engine import Verification, results_as_json
from gpunode.verify.targets import load_inventory, parse_data


def judged(inventory: str, limit: list[str], data: list[str], in_cluster: bool) -> dict:
    """The results of every host and step, as ``--json`` writes them."""
    from gpunode.verify.in_cluster import InClusterVerification

    targets = load_inventory(inventory, limit or None, parse_data(data))
    verification = (InClusterVerification if in_cluster else Verification)(targets)
    try:
        verification.read_all()
        return results_as_json(verification)
    finally:
        verification.close()


def judged_under_pytest(inventory: str, limit: list[str], data: list[str], in_cluster: bool, junit_xml: str) -> dict:
    """The same results, with every host and step a pytest test case in the JUnit report ``junit_xml``."""
    import pytest

    from gpunode.verify.plugin import PreloadedTargets

    # read once: typos and an empty --limit fail here, not in pytest, and the plugin takes these hosts
    targets = load_inventory(inventory, limit or None, parse_data(data))
    with tempfile.TemporaryDirectory(prefix="gpunode-verify-") as tmp:
        results_file = Path(tmp) / "results.json"
        # no plugin of the environment's but ours: another project's pytest plugin cannot change the verdicts
        args = ["--disable-plugin-autoload", "-p", "gpunode.verify.plugin", "--pyargs", "gpunode.verify.suites",
                "--inventory", inventory, "--gpunode-json", str(results_file), "-p", "no:cacheprovider",
                "-o", "junit_family=xunit2", "-o", "junit_suite_name=gpunode-verify", "--rootdir", tmp,
                "-c", "/dev/null", "--junit-xml", junit_xml]
        for pattern in limit:
            args += ["--limit", pattern]
        for pair in data:
            args += ["--data", pair]
        if in_cluster:
            args.append("--in-cluster")
        args += ["-p", "no:terminal"]
        code = pytest.main(args, plugins=[PreloadedTargets(targets)])
        if not results_file.exists():  # the checks did not run to their end: never an empty, silent failure
            try:
                meaning = pytest.ExitCode(int(code)).name
            except ValueError:
                meaning = "unknown"
            raise GpunodeError(f"the verification did not finish: its test run exited {int(code)} ({meaning}) "
                               "and wrote no results",
                               f"run it again; if it repeats, 'python -m pytest -p gpunode.verify.plugin --pyargs "
                               f"gpunode.verify.suites --inventory {inventory}' shows pytest's own words")
        return json.loads(results_file.read_text())


def verify(inventory: str, limit: list[str], junit_xml: str | None, json_path: str | None,
           html_path: str | None, data: list[str] | None = None, in_cluster: bool = False) -> tuple[int, dict]:
    """Judge every step of every host of the inventory; return (exit code, results). ``in_cluster``: the node
    links from the node checker's results in the cluster (``gpunode.verify.in_cluster``), no host reached."""
    if junit_xml:
        results = judged_under_pytest(inventory, limit, data or [], in_cluster, junit_xml)
    else:
        results = judged(inventory, limit, data or [], in_cluster)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    if html_path:
        Path(html_path).write_text(report.html_page(results, inventory))
    failed = any(r["state"] == "finding" for steps in results["hosts"].values() for r in steps.values())
    return (1 if failed else 0), results
