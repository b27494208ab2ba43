"""``gpunode deploy``: the pyinfra CLI without its silent traps, and a JSON report per host.

Refuses a missing inventory and a ``--limit`` that matches nothing before pyinfra
runs, never prompts (``-y`` or ``--dry``), and turns pyinfra's JSON output into
"what changed, what failed, what was unreachable" per host.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpunode import chain
from gpunode.errors import GpunodeError
from gpunode.host_settings import settings_of
from gpunode.inventory_data import check_data
from gpunode.operations import PLANNED_FAILURES
from gpunode.verify.targets import load_inventory, parse_data

STEP_FUNCTIONS = {step.name: tuple(step.deploy.split(":")) for step in chain.STEPS}  # (module, function)
STEP_ORDER = chain.NAMES


def deploy_file(steps: list[str]) -> str:
    """The text of a pyinfra deploy file running ``steps`` (in bootstrap order, driver check first)."""
    unknown = [s for s in steps if s not in STEP_FUNCTIONS and s != "bootstrap"]
    if unknown:
        raise GpunodeError(f"unknown step {unknown[0]!r}",
                           f"steps: {', '.join(STEP_ORDER)}, or bootstrap (all of them)")
    chosen = set(STEP_ORDER) if not steps or "bootstrap" in steps else {"driver", *steps}
    lines = ['"""Written by gpunode deploy."""']
    for step in STEP_ORDER:
        if step in chosen:
            module, function = STEP_FUNCTIONS[step]
            lines.append(f"from {module} import {function}")
    for step in STEP_ORDER:
        if step in chosen:
            lines.append(f"{STEP_FUNCTIONS[step][1]}()")
    return "\n".join(lines) + "\n"


def summarise(payload: dict, hosts: list[str], dry: bool) -> dict:
    """Per host: operations changed (or that would change), failed, and hosts that never answered."""
    report: dict[str, dict] = {h: {"changed": [], "failed": [], "unchanged": 0} for h in hosts}
    if dry:
        for op in payload.get("plan", []):
            for host in op.get("hosts_with_change", []):
                report.setdefault(host, {"changed": [], "failed": [], "unchanged": 0})["changed"].append(op["name"])
    else:
        seen = set()
        for op in (payload.get("results") or {}).get("operations", []):
            for host in op.get("success", []):
                report[host]["changed"].append(op["name"])
                seen.add(host)
            for host in op.get("error", []):
                report[host]["failed"].append(op["name"])
                seen.add(host)
            for host in op.get("no_change", []):
                report[host]["unchanged"] += 1
                seen.add(host)
        for host in hosts:
            if host not in seen:
                report[host]["failed"].append("unreachable: no operation ran (connection failed?)")
    return report


def rolling_batches(hosts: list[str], size: int) -> list[list[str]]:
    """Hosts in batches of ``size`` (the inventory's ``max_unavailable``; 0: all at once)."""
    if not size:
        return [hosts]
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


def run_pyinfra(pyinfra_bin: str, inventory: str, deploy_text: str, limit: list[str], dry: bool,
                data: list[str]) -> tuple[int, dict, list[dict]]:
    """pyinfra's exit code, its JSON, and (dry runs) the hosts' planned failures: what it could not plan."""
    with tempfile.TemporaryDirectory(prefix="gpunode-deploy-") as tmp:
        deploy = Path(tmp) / "gpunode_deploy.py"
        notes = Path(tmp) / "planned-failures.jsonl"
        deploy.write_text(deploy_text)
        argv = [pyinfra_bin, "--json", "--dry" if dry else "-y"]
        for pattern in limit:
            argv += ["--limit", pattern]
        for pair in data:
            argv += ["--data", pair]
        argv += [inventory, str(deploy)]
        env = {**os.environ, PLANNED_FAILURES: str(notes)} if dry else None
        result = subprocess.run(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, check=False,
                                env=env)
        failures = [json.loads(line) for line in notes.read_text().splitlines() if line.strip()] \
            if notes.exists() else []
    try:
        payload = json.loads(result.stdout) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        payload = {}
    return result.returncode, payload, failures


def run_deploy(inventory: str, steps: list[str], limit: list[str], dry: bool, report_path: str | None,
               data: list[str] | None = None, pyinfra: str | None = None, deploy_text: str | None = None,
               ) -> tuple[int, dict]:
    """Run the deploy; exit code 0 ok (in sync, for a dry run), 1 a host failed (or, dry, could not be planned:
    SSH, the API, RBAC, a step that would fail), 2 drift in a dry run.

    With ``max_unavailable`` in the inventory data, hosts go in batches of that size and
    the roll stops at the first batch with a failed host; later hosts are left untouched. ``deploy_text``
    replaces the steps' deploy file (``gpunode undo`` runs its own).
    """
    text = deploy_text or deploy_file(steps)
    targets = load_inventory(inventory, limit or None, parse_data(data or []))
    problems = check_data({t.name: t.data for t in targets})
    if problems:  # before any connection: a typo or a bad value stops the deploy, not one host's step
        raise GpunodeError("the inventory data has problems, nothing was changed:\n  " +
                           "\n  ".join(problem.line() for problem in problems),
                           f"fix them; 'gpunode check {inventory}' checks the data, the hosts and the cluster")
    hosts = [t.name for t in targets]
    pyinfra_bin = pyinfra or str(Path(sys.executable).with_name("pyinfra"))
    batches = [hosts] if dry or not targets else rolling_batches(hosts, settings_of(targets[0]).max_unavailable)
    report: dict[str, dict] = {}
    code = 0
    for number, batch in enumerate(batches):
        returncode, payload, planned_failures = run_pyinfra(pyinfra_bin, inventory, text,
                                                            limit if len(batches) == 1 else batch, dry, data or [])
        if payload:
            part = summarise(payload, batch, dry)
            for failure in planned_failures:  # a dry run that cannot plan a host cannot tell whether it drifted
                if failure["host"] in part:
                    part[failure["host"]]["failed"].append(f"could not tell: {failure['message']}")
        else:  # pyinfra stops without a result when every host failed ("No hosts remaining!") or prepare failed
            why = f"pyinfra exited {returncode} without a result: every host failed or the deploy did not load"
            part = {host: {"changed": [], "failed": [why + " (see its messages above)"], "unchanged": 0}
                    for host in batch}
        report.update(part)
        failed = [h for h, r in part.items() if r["failed"]]
        if failed or returncode != 0:
            code = 1
            for host in [h for later in batches[number + 1:] for h in later]:
                report[host] = {"changed": [], "failed": [], "unchanged": 0,
                                "skipped": f"roll stopped: {', '.join(failed) or 'a host'} failed"}
            break
    if report_path:
        Path(report_path).parent.mkdir(parents=True, exist_ok=True)
        Path(report_path).write_text(json.dumps({"inventory": inventory, "dry": dry, "hosts": report}, indent=2)
                                     + "\n")
    if code:
        return 1, report
    if dry and any(r["changed"] for r in report.values()):
        return 2, report
    return 0, report


def undo_file(packages: bool) -> str:
    """The text of the pyinfra deploy file of ``gpunode undo``."""
    return "\n".join(['"""Written by gpunode undo."""', "from gpunode.steps.undo import undo_node",
                      f"undo_node(packages={packages!r})"]) + "\n"
