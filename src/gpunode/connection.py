"""One way to reach a host for every gpunode command: pyinfra's own connector, with the inventory's data.

``gpunode deploy`` runs pyinfra itself. verify, doctor (``--pod`` too), reboots and the runtime step's re-check reach
hosts through this module, so each of them uses what a deploy uses: the user, key, port and known hosts of the
inventory, its ``ssh_config_file`` (``ProxyJump`` through a bastion included), and sudo with its password where the
data says ``_sudo`` / ``_sudo_password``. Nothing here prompts: a sudo that asks for a password the inventory does
not give, or that refuses the user, is a finding about sudo on that host, never about what the command would read.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyinfra.api import Config, Inventory, State, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.exceptions import ConnectError, PyinfraError
from pyinfra.api.host import Host

from gpunode.errors import GpunodeError

# What sudo says when it will not run the command (sudo 1.9; sudo-rs words its own alike): the user is not
# allowed, has no sudoers entry, gave a wrong password, or was asked for one with no way to answer.
SUDO_REFUSALS = ("is not allowed to execute", "is not in the sudoers file", "incorrect password attempt",
                 "a password is required", "a terminal is required", "interactive authentication is required",
                 "no askpass program specified", "Sorry, try again")


QUOTED_COMMAND = re.compile(r"execute '(?P<command>.*?)(?:'(?P<tail> as \S+ on \S+)$|$)")


class SudoPasswordNeeded(PyinfraError):
    """Raised instead of pyinfra's password prompt: verify and doctor never prompt."""


@dataclass(frozen=True)
class Reply:
    """What one command printed on a host, and whether it exited 0."""

    ok: bool  # pyinfra's success: the exit code was 0
    stdout: str
    stderr: str


class Unreachable(GpunodeError):
    """The host could not be read at all: no connection, or sudo would not run the command."""

    def __init__(self, problem: str, fix: str, code: str, evidence: list[str] | None = None) -> None:
        super().__init__(problem, fix)
        self.code = code
        self.evidence = evidence or []


def command_arguments(host: Host) -> dict[str, Any]:
    """The connector arguments (sudo, its user and password, env, shell) an operation's commands get on ``host``."""
    arguments, _ = pop_global_arguments(host.state, host, {})
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}


def run(host: Host, command: str) -> tuple[bool, list[str], list[str]]:
    """``command`` on the connected ``host`` as an operation would run it; (success, stdout lines, stderr lines)."""
    status, output = host.run_shell_command(StringCommand(command), print_output=False, **command_arguments(host))
    return status, output.stdout_lines, output.stderr_lines


def sudo_refusal(host: Host, stderr: list[str]) -> Unreachable | None:
    """The finding for a command that sudo refused to run (None when sudo is not used or did not refuse)."""
    arguments = command_arguments(host)
    if not arguments.get("_sudo"):
        return None
    said = [_short(line.strip()) for line in stderr if any(words in line for words in SUDO_REFUSALS)]
    if not said:
        return None
    user = host.data.get("ssh_user") or "the SSH user"
    as_user = arguments.get("_sudo_user") or "root"
    if any("password" in line or "terminal" in line or "askpass" in line or "interactive" in line for line in said) \
            and not arguments.get("_sudo_password"):
        fix = (f"give the password as _sudo_password in the inventory data of {host.name} (pyinfra's own key), "
               f"or let {user} run sudo without one (NOPASSWD in /etc/sudoers.d)")
    elif any("incorrect password" in line or "try again" in line for line in said):
        fix = f"correct _sudo_password for {host.name} in the inventory data"
    else:
        fix = (f"allow {user} to run commands as {as_user} with sudo on {host.name} (/etc/sudoers.d), "
               "or give the inventory a user that may")
    return Unreachable(f"sudo refused for user {user} on host {host.name}: {said[-1]}", fix, "sudo-refused",
                       [f"sudo on {host.name}: {line}" for line in said])


def _short(line: str) -> str:
    """sudo's line with the command it quotes cut to its start ("... not allowed to execute '/usr/bin/sh -c echo
    ...' as root on node03."): the facts command is several kilobytes and several lines."""
    match = QUOTED_COMMAND.search(line)
    if not match or len(match["command"]) <= 60:
        return line
    return f"{line[:match.start('command')]}{match['command'][:60]}...'{match['tail'] or ''}"


def where(host: Host) -> str:
    """How the inventory reaches ``host``: user@address:port (and the ssh_config_file, if one)."""
    data = host.data
    user = data.get("ssh_user")
    address = data.get("ssh_hostname") or host.name
    port = data.get("ssh_port")
    config = data.get("ssh_config_file")
    return (f"{user + '@' if user else ''}{address}{':' + str(port) if port else ''}"
            + (f" (ssh_config_file {config})" if config else ""))


def _never_prompt(prompt: str = "", stream: object = None) -> str:
    raise SudoPasswordNeeded(prompt.strip())


class Connections:
    """Hosts of an inventory, reached as pyinfra reaches them, to run read-only commands on (verify, doctor).

    Each host is connected on first use and stays connected until :meth:`close`; hosts are independent, so one
    host's failure is that host's alone.
    """

    def __init__(self, hosts: list[tuple[str, dict[str, Any]]]) -> None:
        self.state = State(Inventory((hosts, {})), Config())
        self._hosts = {host.name: host for host in self.state.inventory}
        self._install_no_prompt()

    def _install_no_prompt(self) -> None:
        from pyinfra.connectors import util

        self._prompt = util.getpass
        util.getpass = _never_prompt

    def run(self, name: str, command: str) -> Reply:
        """``command`` on host ``name`` with its sudo; :class:`Unreachable` when the host cannot run it."""
        host = self._hosts[name]
        if not host.connected:
            try:
                host.connect(show_errors=False, raise_exceptions=True)
            except ConnectError as error:
                said = error.args[0] if error.args else str(error)
                if host.connector_cls.__name__ == "ChrootConnector":  # the node checker's pod, not SSH
                    raise Unreachable(f"cannot read the host's root at {host.data.chroot_directory}: {said}",
                                      "run the node checker as root with the capability SYS_CHROOT and the host's "
                                      "root mounted there (the DaemonSet of 'gpunode render' does both)",
                                      "unreachable", [f"chroot {host.data.chroot_directory}: {said}"]) from error
                raise Unreachable(f"cannot reach {name}: {said}",
                                  "check that the host answers SSH as the inventory reaches it (user, key, port, "
                                  "ssh_config_file / ProxyJump); 'pyinfra INVENTORY exec -- true' shows the same",
                                  "unreachable", [f"ssh {where(host)}: {said}"]) from error
        try:
            status, stdout, stderr = run(host, command)
        except SudoPasswordNeeded as error:
            refusal = sudo_refusal(host, ["sudo: a password is required"])
            raise refusal or Unreachable(str(error), "", "sudo-refused") from error
        except (OSError, EOFError, PyinfraError) as error:
            raise Unreachable(f"cannot reach {name}: the connection broke ({error or type(error).__name__})",
                              "check that the host answers SSH; run the command again", "unreachable") from error
        if not status:
            refusal = sudo_refusal(host, stderr)
            if refusal is not None:
                raise refusal
        return Reply(status, "\n".join(stdout) + ("\n" if stdout else ""), "\n".join(stderr))

    def run_all(self, command: str, parallel: int) -> dict[str, Reply | Unreachable]:
        """``command`` on every host at once (up to ``parallel`` at a time); per host its reply or why not.

        Local hosts (``@local``, ``@chroot/DIR``) run in the calling thread: pyinfra's local connector starts its
        process through gevent, whose child watchers work on the main loop only.
        """
        def one(name: str) -> Reply | Unreachable:
            try:
                return self.run(name, command)
            except Unreachable as error:
                return error
            except Exception as error:  # noqa: BLE001 - one host's surprise is that host's finding, never a traceback
                return Unreachable(f"cannot read {name}: {type(error).__name__}: {error}",
                                   "run the command again; if it persists, report it with this message", "unreachable")

        local = [name for name, host in self._hosts.items()
                 if host.connector_cls.__name__ in ("LocalConnector", "ChrootConnector")]
        remote = [name for name in self._hosts if name not in local]
        replies: dict[str, Reply | Unreachable] = {}
        if remote:
            with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(remote)))) as pool:
                replies.update(zip(remote, pool.map(one, remote), strict=True))
        replies.update((name, one(name)) for name in local)
        return {name: replies[name] for name in self._hosts}

    def close(self) -> None:
        from pyinfra.connectors import util

        for host in self._hosts.values():
            if host.connected:
                host.disconnect()
        util.getpass = self._prompt
