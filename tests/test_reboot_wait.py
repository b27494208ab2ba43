"""Waiting for a rebooted host: a machine still going down may accept a connection and then drop its session."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from paramiko.ssh_exception import SSHException

from gpunode import connection
from gpunode.errors import GpunodeError
from gpunode.operations import reboot


@dataclass
class Output:
    stdout_lines: list[str]
    stderr_lines: list[str] = field(default_factory=list)


@dataclass
class FakeHost:
    """Answers the boot id as ``script`` says, one entry per command: a string, or an exception to raise."""

    script: list[object]
    log_lines: list[str] = field(default_factory=list)
    connected: bool = True
    disconnects: int = 0

    def run_shell_command(self, command: object, print_output: bool = False, **arguments: object
                          ) -> tuple[bool, Output]:
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        return True, Output([str(step)] if step else [])

    def connect(self, show_errors: bool = True) -> None:
        self.connected = True

    def disconnect(self) -> None:
        self.connected = False
        self.disconnects += 1

    def log(self, text: str) -> None:
        self.log_lines.append(text)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "command_arguments", lambda host: {"_sudo": True})  # no pyinfra state here
    monkeypatch.setattr(reboot.time, "sleep", lambda _: None)
    monkeypatch.setattr(reboot, "POLL_SECONDS", 0)


def test_a_session_dropped_while_the_host_goes_down_is_waited_out() -> None:
    host = FakeHost(["old", "", "old", SSHException("SSH session not active"), EOFError(), "new"])
    reboot.reboot_and_wait(host, timeout=60)  # type: ignore[arg-type]
    assert host.log_lines == ["rebooting", "back after the reboot"] and host.script == []
    assert host.disconnects == 3  # after asking for the reboot, then once per dropped session


def test_a_host_that_never_comes_back_fails_with_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 10_000, 50))
    monkeypatch.setattr(reboot.time, "monotonic", lambda: next(clock))
    host = FakeHost(["old", ""] + [SSHException("SSH session not active")] * 10)
    with pytest.raises(GpunodeError, match="did not come back within 120 s"):
        reboot.reboot_and_wait(host, timeout=120)  # type: ignore[arg-type]
