"""PID 1 of a simulated node until it hands over to the node's own init.

Started by the fleet inside fresh UTS, IPC, mount and PID namespaces (and the
node's network namespace). It reads the boot plan the fleet wrote, mounts the
node's root (overlay of the shared images and the node's own upper folder),
``/proc``, ``/sys``, a private ``/dev`` with the simulated NVIDIA device nodes,
the simulated ``/proc/driver/nvidia`` and ``/sys/module/nvidia``, the runtime
data folders on real disk, then pivots into that root and execs the systemd
stand-in. Every mount lives in the node's private mount namespace, so nothing
is left on the host when the node stops.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

OLD_ROOT = ".gpunode-oldroot"
# What a node's init starts with, as a booted machine's PID 1 does: not the host's environment (the
# simulator's PYTHONPATH names the host's Python, which broke the nodes' own python3 of another version).
INIT_ENVIRONMENT = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
# Machine-wide kernel settings a real kubelet wants (it would write them, or with protectKernelDefaults refuse to
# start when they differ). Inside a node, files with these values are bound read-only over them: the kubelet
# reads what it wants, and nothing in a node can change the machine's settings.
KUBELET_SYSCTLS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
BASIC_DEVICES = (
    ("null", 1, 3, 0o666), ("zero", 1, 5, 0o666), ("full", 1, 7, 0o666), ("random", 1, 8, 0o666),
    ("urandom", 1, 9, 0o666), ("tty", 5, 0, 0o666), ("net/tun", 10, 200, 0o666), ("fuse", 10, 229, 0o666),
    ("kmsg", 1, 11, 0o644),
)


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def mknod(path: Path, major: int, minor: int, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, mode | 0o020000, os.makedev(major, minor))
    os.chmod(path, mode)


def write_tree(root: Path, files: dict[str, str]) -> None:
    for relative, text in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def setup_dev(dev: Path, devices: list[list]) -> None:
    sh("mount", "-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", str(dev))
    for name, major, minor, mode in BASIC_DEVICES:
        mknod(dev / name, major, minor, mode)
    for name, major, minor, mode in devices:
        mknod(dev / name, major, minor, mode)
    for folder in ("pts", "shm", "mqueue"):
        (dev / folder).mkdir()
    sh("mount", "-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", str(dev / "pts"))
    os.symlink("pts/ptmx", dev / "ptmx")
    sh("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", str(dev / "shm"))
    sh("mount", "-t", "mqueue", "mqueue", str(dev / "mqueue"))
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore")):
        os.symlink(target, dev / link)
    (dev / "console").touch()


def boot(plan: dict) -> None:
    merged = Path(plan["merged"])
    sh("mount", "--make-rprivate", "/")
    sh("hostname", plan["hostname"])
    lowerdir = ":".join(plan["lowers"])
    sh("mount", "-t", "overlay", "overlay", "-o",
       f"lowerdir={lowerdir},upperdir={plan['upper']},workdir={plan['work']}", str(merged))
    sh("mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", str(merged / "proc"))
    if plan.get("boot_id"):  # a boot of its own: a reboot of the node changes it, as on a real machine
        boot_id = Path(plan["upper"]).parent / "boot_id"
        boot_id.write_text(plan["boot_id"] + "\n")
        sh("mount", "--bind", str(boot_id), str(merged / "proc/sys/kernel/random/boot_id"))
    sysctls = Path(plan["upper"]).parent / "sysctl"
    sysctls.mkdir(exist_ok=True)
    for key, value in KUBELET_SYSCTLS.items():
        shown = sysctls / key.replace("/", ".")
        shown.write_text(value + "\n")
        target = merged / "proc/sys" / key
        sh("mount", "--bind", str(shown), str(target))
        sh("mount", "-o", "remount,bind,ro", str(target))
    sh("mount", "-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", str(merged / "sys"))
    sh("mount", "--rbind", "/sys/fs/cgroup", str(merged / "sys/fs/cgroup"))
    setup_dev(merged / "dev", plan["devices"])
    sh("mount", "--bind", "/dev/console" if Path("/dev/console").exists() else "/dev/null",
       str(merged / "dev/console"))
    sh("mount", "-t", "tmpfs", "-o", "mode=755,nosuid,nodev", "tmpfs", str(merged / "run"))
    for folder in ("run/systemd/system", "run/lock", "run/sshd", "run/gpunode-sim/events"):
        (merged / folder).mkdir(parents=True, exist_ok=True)
    (merged / "run/gpunode-sim/events/health-events").touch()  # the simulated GPUs' event channel (Xid, ECC)
    for inside, outside in plan["data_binds"].items():
        (merged / inside).mkdir(parents=True, exist_ok=True)
        sh("mount", "--bind", outside, str(merged / inside))
    for root in plan.get("code_binds", []):
        target = merged / root.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        sh("mount", "--bind", root, str(target))
        sh("mount", "-o", "remount,bind,ro", str(target))
    if plan["proc_driver"]:
        target = merged / "proc/driver"
        sh("mount", "-t", "tmpfs", "-o", "mode=555", "tmpfs", str(target))
        write_tree(target, plan["proc_driver"])
        sh("mount", "-o", "remount,ro", str(target))
    if plan["sys_module"]:
        target = merged / "sys/module"
        sh("mount", "-t", "tmpfs", "-o", "mode=755", "tmpfs", str(target))
        write_tree(target, plan["sys_module"])
        sh("mount", "-o", "remount,ro", str(target))
    os.chdir(merged)
    (merged / OLD_ROOT).mkdir(exist_ok=True)
    sh("pivot_root", ".", OLD_ROOT)
    os.chdir("/")
    # the node's root is a shared mount, as systemd makes it at boot (inside the node's own mount namespace: no
    # peer outside it): runtimes may then bind it into a container as a slave (docker refuses a private one)
    boot_script = (f"umount -l /{OLD_ROOT} && rmdir /{OLD_ROOT}; mount --make-rshared /; "
                   "exec /usr/local/sbin/sim-init")
    os.execve("/bin/sh", ["/bin/sh", "-c", boot_script], INIT_ENVIRONMENT)


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    try:
        boot(plan)
    except (subprocess.CalledProcessError, OSError) as error:
        print(f"gpunode node init failed for {plan.get('hostname')}: {error}", file=sys.stderr)
        return 1
    return 0  # not reached: boot() execs the node's init


if __name__ == "__main__":
    sys.exit(main())
