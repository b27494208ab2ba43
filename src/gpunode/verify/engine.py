"""The verification engine: every host's facts read once (all hosts in parallel), each step judged from them.

Used by ``gpunode doctor`` directly and by the pytest suites (``gpunode.verify.plugin``); it imports no pytest.
Nothing is changed on any host.
"""

from __future__ import annotations

import traceback
from functools import cached_property

from gpunode.connection import Connections, Reply, Unreachable
from gpunode.diagnosis import Finding, Verdict
from gpunode.errors import GpunodeError
from gpunode.facts.node import facts_command, split_facts
from gpunode.host_settings import settings_of
from gpunode.verify.checks import STEPS, ClusterView, StepResult, judge
from gpunode.verify.targets import Target

MAX_PARALLEL = 32


class Verification:
    """The session's targets, their facts and the verdicts, shared by every test."""

    def __init__(self, targets: list[Target]) -> None:
        self.targets = {t.name: t for t in targets}
        self.verdicts: dict[str, dict[str, StepResult]] = {}
        self.errors: dict[str, Finding] = {}  # hosts that could not be read: the "connection" link's finding
        self.facts: dict[str, dict[str, dict]] = {}
        self.cluster = ClusterView()

    @cached_property
    def connections(self) -> Connections:
        """The hosts, reached on first use: a verification from the cluster (``--in-cluster``) reaches none."""
        return Connections([(t.name, t.data) for t in self.targets.values()])

    def close(self) -> None:
        """Close the connections this verification opened (none if it reached no host)."""
        if "connections" in self.__dict__:
            self.connections.close()

    def read_all(self) -> None:
        for name, reply in self.connections.run_all(facts_command(), MAX_PARALLEL).items():
            outcome = self._judge(name, reply)
            if isinstance(outcome, Finding):
                self.errors[name] = outcome
            else:
                self.verdicts[name] = outcome

    def _judge(self, name: str, reply: Reply | Unreachable) -> dict[str, StepResult] | Finding:
        if isinstance(reply, Unreachable):
            return Finding("connection", Verdict.FINDING, reply.problem, reply.evidence, reply.fix or "", reply.code)
        if not reply.ok and not reply.stdout:
            said = (reply.stderr.strip().splitlines() or ["no output"])[-1]
            return Finding("connection", Verdict.FINDING, f"cannot read {name}: the facts command failed: {said}",
                           [f"stderr on {name}: {line}" for line in reply.stderr.strip().splitlines()[-5:]],
                           "run 'gpunode doctor' again; if it persists, run the command by hand as the inventory's "
                           "user", "unreadable")
        try:
            settings = settings_of(self.targets[name])
        except GpunodeError as error:
            return Finding("inventory data", Verdict.FINDING, f"bad inventory data for {name}: {error.problem}",
                           fix=error.fix or "", code="bad-data")
        self.facts[name] = split_facts(reply.stdout)
        try:
            return judge(name, self.facts[name], settings, self.cluster)
        except Exception as error:  # noqa: BLE001 - one host's surprise fails that host alone, never the run
            return Finding("diagnosis", Verdict.FINDING, f"gpunode could not judge {name}'s facts: "
                           f"{type(error).__name__}: {error}",
                           [f"{frame.filename.rsplit('/src/', 1)[-1]}:{frame.lineno} in {frame.name}"
                            for frame in traceback.extract_tb(error.__traceback__)[-3:]],
                           f"a gpunode bug: report it with 'gpunode doctor --limit {name} --json' and the facts "
                           "command's output on that host", "judge-failed")

    def result(self, host: str, step: str) -> StepResult:
        """The step's verdict; a host that could not be read fails once, at the chain's first step, with the
        connection's one line (ssh's or sudo's words), and every later step is "not checked" because of it."""
        if host in self.errors:
            if step == STEPS[0]:
                return StepResult(host, step, Verdict.FINDING, self.errors[host].what, [self.errors[host]])
            return StepResult(host, step, Verdict.NOT_CHECKED,
                              f"not checked: {host} could not be read (see {STEPS[0]})")
        return self.verdicts[host][step]


def results_as_json(verification: Verification) -> dict:
    hosts = {}
    for host in verification.targets:
        steps = {step: verification.result(host, step).as_json() for step in STEPS}
        hosts[host] = steps
    return {"steps": list(STEPS), "hosts": hosts}
