"""Commands on a simulated node as the tests' operator runs them: SSH through the bastion as the non-root user,
root's part through sudo (the nodes refuse root logins, as production nodes do)."""

from __future__ import annotations

import shlex
import subprocess


def ssh(fleet: dict, node: str, command: str, *, root: bool = True, timeout: float = 120,
        options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``command`` on ``node`` over the fleet's ssh_config; as root through ``sudo -n`` unless ``root`` is False."""
    remote = f"sudo -n sh -c {shlex.quote(command)}" if root else command
    return subprocess.run(["ssh", "-F", fleet["ssh_config"], *options, node, remote], capture_output=True, text=True,
                          timeout=timeout, check=False)


def ssh_ok(fleet: dict, node: str, command: str, *, root: bool = True, timeout: float = 120) -> str:
    """``command``'s output; the test fails with its stderr when it exits non-zero."""
    result = ssh(fleet, node, command, root=root, timeout=timeout)
    assert result.returncode == 0, f"{node}: {command}\n{result.stdout}\n{result.stderr}"
    return result.stdout
