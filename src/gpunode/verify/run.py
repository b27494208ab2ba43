"""``gpunode verify``: the suites under pytest, then the table and the reports CI keeps."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from gpunode.errors import GpunodeError
from gpunode.verify import report
from gpunode.verify.targets import load_inventory, parse_data


def verify(inventory: str, limit: list[str], junit_xml: str | None, json_path: str | None,
           html_path: str | None, data: list[str] | None = None, quiet: bool = True,
           in_cluster: bool = False) -> tuple[int, dict]:
    """Run every step's suite against the inventory; return (exit code, results). ``in_cluster``: the node
    links from the node checker's results in the cluster (``gpunode.verify.in_cluster``), no host reached."""
    load_inventory(inventory, limit or None, parse_data(data or []))  # typos and empty --limit fail here
    with tempfile.TemporaryDirectory(prefix="gpunode-verify-") as tmp:
        results_file = Path(tmp) / "results.json"
        args = ["-p", "gpunode.verify.plugin", "--pyargs", "gpunode.verify.suites", "--inventory", inventory,
                "--gpunode-json",
                str(results_file), "-p", "no:cacheprovider", "-o", "junit_family=xunit2",
                "-o", "junit_suite_name=gpunode-verify", "--rootdir", tmp, "-c", "/dev/null"]
        for pattern in limit:
            args += ["--limit", pattern]
        for pair in data or []:
            args += ["--data", pair]
        if in_cluster:
            args.append("--in-cluster")
        if junit_xml:
            args += ["--junit-xml", junit_xml]
        args += ["-p", "no:terminal"] if quiet else ["-rfs"]
        code = pytest.main(args)
        if not results_file.exists():  # the checks did not run to their end: never an empty, silent failure
            try:
                meaning = pytest.ExitCode(int(code)).name
            except ValueError:
                meaning = "unknown"
            raise GpunodeError(f"the verification did not finish: its test run exited {int(code)} ({meaning}) "
                               "and wrote no results",
                               f"run it again; if it repeats, 'python -m pytest -p gpunode.verify.plugin --pyargs "
                               f"gpunode.verify.suites --inventory {inventory}' shows pytest's own words")
        results = json.loads(results_file.read_text())
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    if html_path:
        Path(html_path).write_text(report.html_page(results, inventory))
    failed = any(r["state"] == "finding" for steps in results["hosts"].values() for r in steps.values())
    return (1 if failed else 0), results
