"""pytest side of the verification suites: loads a pyinfra inventory and hands each test its host.

    pytest -p gpunode.verify.plugin --pyargs gpunode.verify.suites --inventory inventories/prod.py
    pytest -p gpunode.verify.plugin --pyargs gpunode.verify.suites --inventory inventories/sim.py --limit node01

Activated by ``-p`` only (``gpunode verify`` passes it): no pytest11 entry point, so other projects' pytest runs
in the same environment get no --inventory/--limit/--data. The work is the engine's
(``gpunode.verify.engine``): every host's facts read once, all hosts in parallel, before the first test; each
suite then judges its step from them. Nothing is changed on any host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.diagnosis import Verdict
from gpunode.errors import GpunodeError
from gpunode.verify.engine import Verification, results_as_json
from gpunode.verify.in_cluster import InClusterVerification
from gpunode.verify.targets import Target, load_inventory, parse_data


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpunode", "gpunode verification")
    group.addoption("--inventory", dest="gpunode_inventory", help="pyinfra inventory file to verify")
    group.addoption("--limit", dest="gpunode_limit", action="append", default=[],
                    help="only these hosts or groups (glob patterns work); repeatable")
    group.addoption("--data", dest="gpunode_data", action="append", default=[],
                    help="override host data, KEY=VALUE, like pyinfra's --data; repeatable")
    group.addoption("--gpunode-json", dest="gpunode_json", help="write results as JSON to this file")
    group.addoption("--in-cluster", dest="gpunode_in_cluster", action="store_true", default=False,
                    help="read the node checker's results from the cluster instead of reaching every host")


@pytest.fixture(scope="session")
def gpunode_verification(request: pytest.FixtureRequest) -> Verification:
    verification = request.config.stash.get(VERIFICATION_KEY, None)
    if verification is None:
        pytest.exit("gpunode verification: no --inventory given", returncode=4)
    return verification


VERIFICATION_KEY = pytest.StashKey[Verification]()


class PreloadedTargets:
    """The inventory's hosts as ``gpunode verify`` already loaded them, handed to ``pytest.main`` as a plugin
    object: the inventory is read once per verify, not again here."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = targets


def pytest_sessionstart(session: pytest.Session) -> None:
    inventory = session.config.getoption("gpunode_inventory", default=None)
    if not inventory:
        return
    preloaded = next((p for p in session.config.pluginmanager.get_plugins() if isinstance(p, PreloadedTargets)),
                     None)
    try:
        targets = preloaded.targets if preloaded is not None else load_inventory(
            inventory, session.config.getoption("gpunode_limit") or None,
            parse_data(session.config.getoption("gpunode_data")))
    except GpunodeError as error:
        raise pytest.UsageError(str(error)) from error
    kind = InClusterVerification if session.config.getoption("gpunode_in_cluster") else Verification
    verification = kind(targets)
    verification.read_all()
    session.config.stash[VERIFICATION_KEY] = verification


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpunode_host" not in metafunc.fixturenames:
        return
    verification = metafunc.config.stash.get(VERIFICATION_KEY, None)
    hosts = list(verification.targets) if verification else []
    metafunc.parametrize("gpunode_host", hosts, ids=hosts)


def check_step(verification: Verification, host: str, step: str) -> None:
    """The body of every suite, in the verdict's words: ok passes; not checked skips with why; a finding fails
    with what, evidence and fix."""
    result = verification.result(host, step)
    if result.state is Verdict.NOT_CHECKED:
        pytest.skip(result.reason if result.reason.startswith("not checked") else f"not checked: {result.reason}")
    if result.state is Verdict.FINDING:
        detail = "\n".join(str(f) for f in result.findings) or result.reason
        pytest.fail(f"finding: {step} on {host}: {detail}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    verification = session.config.stash.get(VERIFICATION_KEY, None)
    path = session.config.getoption("gpunode_json", default=None)
    if verification is None:
        return
    if path:
        Path(path).write_text(json.dumps(results_as_json(verification), indent=2) + "\n")
    verification.close()
