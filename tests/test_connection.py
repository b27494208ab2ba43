"""gpunode.connection: sudo's refusals, in sudo's own words (as the simulated nodes' sudo 1.9.13 printed them), turned
into one finding per host that names the user, the host and the fix; no sudo, no finding."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpunode.connection import Connections, sudo_refusal

TOO_LONG = "/usr/bin/sh -c echo '##gpunode-fact:driver'; ( echo '##gpunode:smi'; if command -v nvidia-smi"
CASES = [
    # (host data, sudo's stderr, what the finding says after the host, words of the fix)
    ({}, ["sudo: a password is required"], "sudo: a password is required", "give the password as _sudo_password"),
    ({}, ["sudo: a terminal is required to read the password; either use the -S option to read from standard input "
          "or configure an askpass helper", "sudo: a password is required"], "sudo: a password is required",
     "give the password as _sudo_password"),
    ({"_sudo_password": "x"}, ["Sorry, try again.", "Sorry, try again.", "sudo: 3 incorrect password attempts"],
     "sudo: 3 incorrect password attempts", "correct _sudo_password for node03"),
    ({"_sudo_password": "x"}, ["sre is not in the sudoers file."], "sre is not in the sudoers file.",
     "allow sre to run commands as root with sudo on node03"),
    ({"_sudo_password": "x"}, [f"Sorry, user sre is not allowed to execute '{TOO_LONG}"],
     "Sorry, user sre is not allowed to execute '/usr/bin/sh -c echo '##gpunode-fact:driver'; ( echo '##gpuno...'",
     "/etc/sudoers.d"),
    ({"_sudo_user": "gpuadmin"}, ["Sorry, user sre is not allowed to execute '/usr/bin/true' as gpuadmin on node03."],
     "Sorry, user sre is not allowed to execute '/usr/bin/true' as gpuadmin on node03.",
     "run commands as gpuadmin"),
]


@pytest.fixture
def reach() -> Iterator[Connections]:
    connections = Connections([("node03", {"_sudo": True, "ssh_user": "sre"}), ("plain", {"ssh_user": "sre"})])
    yield connections
    connections.close()


@pytest.mark.parametrize(("data", "stderr", "said", "fix"), CASES)
def test_sudo_refusals_are_named_with_their_fix(reach: Connections, data: dict, stderr: list[str], said: str,
                                               fix: str) -> None:
    host = reach.state.inventory.get_host("node03")
    for key, value in data.items():
        setattr(host.data, key, value)
    finding = sudo_refusal(host, stderr)
    assert finding is not None
    assert finding.problem == f"sudo refused for user sre on host node03: {said}"
    assert fix in (finding.fix or ""), finding.fix
    assert finding.code == "sudo-refused" and finding.evidence[-1] == f"sudo on node03: {said}"


def test_without_sudo_or_without_sudos_words_there_is_no_refusal(reach: Connections) -> None:
    assert sudo_refusal(reach.state.inventory.get_host("plain"), ["sudo: a password is required"]) is None
    assert sudo_refusal(reach.state.inventory.get_host("node03"), ["containerd: not found"]) is None
