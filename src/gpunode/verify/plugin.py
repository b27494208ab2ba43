"""pytest plugin of the verification suites: loads a pyinfra inventory and hands each test its host.

    pytest --pyargs gpunode.verify.suites -p gpunode.verify.plugin --inventory inventories/prod.py
    pytest --pyargs gpunode.verify.suites -p gpunode.verify.plugin --inventory inventories/sim.py \\
           --limit node01 --junit-xml verify.xml

Every host's facts are read once, all hosts in parallel, before the first test;
each suite then judges its step from them. Nothing is changed on any host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpunode.connection import Connections, Reply, Unreachable
from gpunode.diagnosis import Finding, Severity
from gpunode.errors import GpunodeError
from gpunode.facts.node import facts_command, split_facts
from gpunode.verify.checks import STEPS, ClusterView, StepResult, judge
from gpunode.verify.targets import Target, load_inventory, parse_data

MAX_PARALLEL = 32


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpunode", "gpunode verification")
    group.addoption("--inventory", dest="gpunode_inventory", help="pyinfra inventory file to verify")
    group.addoption("--limit", dest="gpunode_limit", action="append", default=[],
                    help="only these hosts or groups (glob patterns work); repeatable")
    group.addoption("--data", dest="gpunode_data", action="append", default=[],
                    help="override host data, KEY=VALUE, like pyinfra's --data; repeatable")
    group.addoption("--gpunode-json", dest="gpunode_json", help="write results as JSON to this file")


class Verification:
    """The session's targets, their facts and the verdicts, shared by every test."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = {t.name: t for t in targets}
        self.connections = Connections([(t.name, t.data) for t in targets])
        self.verdicts: dict[str, dict[str, StepResult]] = {}
        self.errors: dict[str, Finding] = {}  # hosts that could not be read: the "connection" link's finding
        self.facts: dict[str, dict[str, dict]] = {}
        self.cluster = ClusterView()

    def read_all(self) -> None:
        for name, reply in self.connections.run_all(facts_command(), MAX_PARALLEL).items():
            outcome = self._judge(name, reply)
            if isinstance(outcome, Finding):
                self.errors[name] = outcome
            else:
                self.verdicts[name] = outcome

    def _judge(self, name: str, reply: Reply | Unreachable) -> dict[str, StepResult] | Finding:
        if isinstance(reply, Unreachable):
            return Finding("connection", Severity.FAIL, reply.problem, reply.evidence, reply.fix or "", reply.code)
        if not reply.ok and not reply.stdout:
            said = (reply.stderr.strip().splitlines() or ["no output"])[-1]
            return Finding("connection", Severity.FAIL, f"cannot read {name}: the facts command failed: {said}",
                           [f"stderr on {name}: {line}" for line in reply.stderr.strip().splitlines()[-5:]],
                           "run 'gpunode doctor' again; if it persists, run the command by hand as the inventory's "
                           "user", "unreadable")
        try:
            settings = self.targets[name].settings
        except GpunodeError as error:
            return Finding("inventory data", Severity.FAIL, f"bad inventory data for {name}: {error.problem}",
                           fix=error.fix or "", code="bad-data")
        self.facts[name] = split_facts(reply.stdout)
        return judge(name, self.facts[name], settings, self.targets[name].data, self.cluster)

    def result(self, host: str, step: str) -> StepResult:
        """The step's verdict; a host that could not be read fails once, at the chain's first step, with the
        connection's one line (ssh's or sudo's words), and every later step is "not checked" because of it."""
        if host in self.errors:
            if step == STEPS[0]:
                return StepResult(host, step, "fail", self.errors[host].what, [self.errors[host]])
            return StepResult(host, step, "skip", f"not checked: {host} could not be read (see {STEPS[0]})")
        return self.verdicts[host][step]


@pytest.fixture(scope="session")
def gpunode_verification(request: pytest.FixtureRequest) -> Verification:
    verification = request.config.stash.get(VERIFICATION_KEY, None)
    if verification is None:
        pytest.exit("gpunode verification: no --inventory given", returncode=4)
    return verification


VERIFICATION_KEY = pytest.StashKey[Verification]()


def pytest_sessionstart(session: pytest.Session) -> None:
    inventory = session.config.getoption("gpunode_inventory", default=None)
    if not inventory:
        return
    try:
        targets = load_inventory(inventory, session.config.getoption("gpunode_limit") or None,
                                 parse_data(session.config.getoption("gpunode_data")))
    except GpunodeError as error:
        raise pytest.UsageError(str(error)) from error
    verification = Verification(targets)
    verification.read_all()
    session.config.stash[VERIFICATION_KEY] = verification


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpunode_host" not in metafunc.fixturenames:
        return
    verification = metafunc.config.stash.get(VERIFICATION_KEY, None)
    hosts = list(verification.targets) if verification else []
    metafunc.parametrize("gpunode_host", hosts, ids=hosts)


def check_step(verification: Verification, host: str, step: str) -> None:
    """The body of every suite: pass, skip with why, or fail with what, evidence and fix."""
    result = verification.result(host, step)
    if result.outcome == "skip":
        pytest.skip(result.reason)
    if result.outcome == "fail":
        detail = "\n".join(str(f) for f in result.findings) or result.reason
        pytest.fail(f"{step} on {host}: {detail}", pytrace=False)


def pytest_sessionfinish(session: pytest.Session) -> None:
    verification = session.config.stash.get(VERIFICATION_KEY, None)
    path = session.config.getoption("gpunode_json", default=None)
    if verification is None:
        return
    if path:
        Path(path).write_text(json.dumps(results_as_json(verification), indent=2) + "\n")
    verification.connections.close()


def results_as_json(verification: Verification) -> dict:
    hosts = {}
    for host in verification.targets:
        steps = {}
        for step in STEPS:
            result = verification.result(host, step)
            steps[step] = {"outcome": result.outcome, "state": result.state, "reason": result.reason,
                           "proof": result.proof,
                           "findings": [{"severity": str(f.severity), "what": f.what, "evidence": f.evidence,
                                         "fix": f.fix, "code": f.code}
                                        for f in result.findings if f.severity is not Severity.OK]}
        hosts[host] = steps
    return {"steps": list(STEPS), "hosts": hosts}
