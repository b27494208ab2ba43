"""The systemd stand-in of simulated nodes: docker-systemctl-replacement, patched.

The nodes have no real systemd (they run in plain namespaces), yet pyinfra's
systemd facts, testinfra's SystemdService and Debian's maintainer scripts all
call ``systemctl``. docker-systemctl-replacement (PyPI, stdlib-only) parses the
real unit files and runs as PID 1. Three of its delays make restarts slow and
one hangs them (the feasibility study measured each), so the pinned release is
patched; a patch that no longer applies stops the build instead of silently
shipping an unpatched init.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gpunode.errors import GpunodeError

RELEASE = "1.7.1097"
PACKAGE = "docker-systemctl-replacement"

PATCHES: tuple[tuple[str, str, str], ...] = (
    (
        "no 1 s sleep before the first read of $NOTIFY_SOCKET",
        "            if not attempt: # first one\n                time.sleep(1) # until TimeoutStartSec\n",
        "            if False: # gpunode: read at once\n                time.sleep(1) # until TimeoutStartSec\n",
    ),
    (
        "no 3 s wait for MAINPID= after READY=1 (the pid is known from the fork)",
        "        mainpidTimeout = lapseTimeout # Apache sends READY before MAINPID\n",
        "        mainpidTimeout = 1 # gpunode: the forked pid is the main pid\n",
    ),
    (
        "KillMode=process waits for the main process only (else restarting sshd from ssh hangs 90 s)",
        "        pidlist = self.pidlist_of(mainpid) # here\n",
        "        pidlist = [mainpid] if useKillMode == \"process\" else self.pidlist_of(mainpid)"
        " # gpunode\n",
    ),
    (
        "poll stopped services every 50 ms rather than every second",
        "                break\n            time.sleep(1) # until TimeoutStopSec\n"
        "        if dead or not doSendSIGKILL:",
        "                break\n            time.sleep(0.05) # gpunode\n        if dead or not doSendSIGKILL:",
    ),
    (
        "a non-root user reads the system units' state in /run, as systemctl does (it was looking in /tmp/run)",
        '        for p in ("/run", "/var/run", "{tmp_var}/run"):\n            path = p.format(**locals())\n'
        '            if os.path.isdir(path) and os.access(path, os.W_OK):\n',
        '        for p in ("/run", "/var/run", "{tmp_var}/run"):\n            path = p.format(**locals())\n'
        '            if os.path.isdir(path) and (os.access(path, os.W_OK) or p == "/run"):  # gpunode\n',
    ),
    (
        "a unit's main process is looked up in the init's process table (/proc), as systemctl asks systemd, not in"
        " the caller's PID namespace: a node agent's pod chrooted into the host asks 'is-active' too",
        "    try:\n        os.kill(pid, 0)\n    except OSError as err:\n",
        "    if os.path.isdir(\"/proc/1\"):  # gpunode: the node's procfs is the init's process table\n"
        "        return os.path.isdir(\"/proc/%d\" % pid)\n"
        "    try:\n        os.kill(pid, 0)\n    except OSError as err:\n",
    ),
    (
        "a read-only root (a node agent's pod reading the host through chroot) is read, not written: an existing"
        " runtime folder is used as it is",
        '            if os.path.isdir(path) and os.access(path, os.W_OK):\n                return path\n'
        '        os.makedirs(path, 0o700) # "/tmp/run/user/{uid}"\n',
        '            if os.path.isdir(path) and os.access(path, os.W_OK):\n                return path\n'
        '        if os.path.isdir(path):  # gpunode: read-only, as the host seen from a pod\n            return path\n'
        '        os.makedirs(path, 0o700) # "/tmp/run/user/{uid}"\n',
    ),
    (
        "unit search misses are debug noise, not errors on every call",
        '                    logg.error("not found %s", filepath)\n',
        '                    logg.debug("not found %s", filepath)\n',
    ),
)


def patch_source(text: str) -> str:
    """Apply every patch once; raise if one does not match the pinned release."""
    for why, old, new in PATCHES:
        if text.count(old) != 1:
            raise GpunodeError(f"patching {PACKAGE} {RELEASE} failed: '{why}' does not apply",
                               "the pinned release changed; update gpunode_sim.guest.systemctl.PATCHES")
        text = text.replace(old, new)
    return text


def fetch(cache: Path) -> dict[str, str]:
    """The patched ``systemctl3.py`` and ``journalctl3.py`` texts, downloading the wheel once."""
    wheels = sorted(cache.glob(f"docker_systemctl_replacement-{RELEASE}-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            result = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                 "--dest", tmp, f"{PACKAGE}=={RELEASE}"], capture_output=True, text=True, check=False)
            found = sorted(Path(tmp).glob("*.whl"))
            if result.returncode != 0 or not found:
                raise GpunodeError(f"could not download {PACKAGE}=={RELEASE} from the package index: "
                                   f"{result.stderr.strip()[-400:]}",
                                   "check that pip reaches the package index (pip config list)")
            target = cache / found[0].name
            target.write_bytes(found[0].read_bytes())
            wheels = [target]
    with zipfile.ZipFile(wheels[-1]) as wheel:
        systemctl = wheel.read("systemctl2/systemctl3.py").decode()
        journalctl = wheel.read("systemctl2/journalctl3.py").decode()
    return {"systemctl3.py": patch_source(systemctl), "journalctl3.py": journalctl}
