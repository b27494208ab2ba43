"""Shared fixtures: the simulated fleet for end-to-end tests."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# pyinfra-testing imports pyinfra_cli, which gevent-monkey-patches the whole process on import, and the
# in-process gRPC kubelet stand-in hangs in a patched process. So the data-driven pyinfra tests run in
# their own session: scripts/test runs `pytest` and then `GPUNODE_PYINFRA_DATA_TESTS=1 pytest`.
PYINFRA_DATA_TESTS = {"test_facts.py", "test_operations.py"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    wanted = os.environ.get("GPUNODE_PYINFRA_DATA_TESTS") == "1"
    return (collection_path.name in PYINFRA_DATA_TESTS) != wanted
LAST = "test_packaging.py"  # its pyinfra bootstrap must find the session fleet bootstrapped by the others


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name == LAST)  # stable: file order otherwise


GPUNODE = [sys.executable, "-m", "gpunode.cli"]
# containerd's default config with what the simulated nodes' admin sets for their kubelet (the locally built pause
# image, no oom_score_adj below containerd's own, Debian's CNI folder, the registries' trust in certs.d): a node's
# config "reset to the default" without making its pods impossible to start for reasons of this machine's, not of
# the nvidia runtime
CONTAINERD_DEFAULT = ("containerd config default | sed -e 's|registry.k8s.io/pause:3.6|registry.k8s.io/pause:3.10.1|'"
                      " -e 's|restrict_oom_score_adj = false|restrict_oom_score_adj = true|'"
                      " -e 's|/opt/cni/bin|/usr/lib/cni|'"
                      """ -e 's|config_path = ""|config_path = "/etc/containerd/certs.d"|'""")


def fleet_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the simulated fleet needs root"
    for tool in ("debootstrap", "socat", "unshare", "zstd"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (run scripts/setup-host)"
    return None


def gpunode(*args: str, env: dict[str, str], timeout: float = 900, check: bool = True,
            ) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*GPUNODE, *args], capture_output=True, text=True, env=env, timeout=timeout,
                            cwd=REPO, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"gpunode {' '.join(args)} exited {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture(scope="session")
def net_block() -> Iterator[int]:
    """The first of four loopback blocks (127.0.N.x to 127.0.N+3.x) this session's fleets use.

    Held with a lock for the whole session, so two test runs on one machine never share a block; from 20 up,
    not the default 10, where a demo fleet may be running.
    """
    for base in range(20, 244, 4):
        handle = open(Path(tempfile.gettempdir()) / f"gpunode-test-net-{base}.lock", "w")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        try:
            yield base
        finally:
            handle.close()
        return
    pytest.fail("no free loopback block for the test fleets: 56 test runs at once?")


def block(env: dict[str, str], offset: int = 0) -> str:
    """The loopback block ``offset`` after the session fleet's (another fleet of the same run)."""
    return str(int(env["GPUNODE_SIM_NET"]) + offset)


@pytest.fixture(scope="session")
def sim_env(tmp_path_factory: pytest.TempPathFactory, net_block: int) -> dict[str, str]:
    """Environment for a test fleet: its own state folder and loopback block, the machine's shared caches."""
    reason = fleet_unavailable()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("sim")
    # the node checker's DaemonSet only where a test deploys it (tests/test_whole_chain.py): its pods would add their
    # load to every test, and its settings change with every --data a test passes
    return {**os.environ, "GPUNODE_SIM_DIR": str(state), "GPUNODE_SIM_NET": str(net_block), "PYTHONUNBUFFERED": "1",
            "GPUNODE_SIM_CHECKER": "off"}


@pytest.fixture(scope="session")
def fleet(sim_env: dict[str, str]) -> Iterator[dict]:
    """Three running nodes (A100/containerd, V100/docker, CPU-only), torn down at the end."""
    try:  # a fleet that came up only in part is torn down too
        up = gpunode("sim", "up", "--json", env=sim_env)
        info = json.loads(up.stdout)
        info["env"] = sim_env
        info["up_stderr"] = up.stderr
        yield info
    finally:
        gpunode("sim", "down", env=sim_env, check=False)


# Machine-wide settings a kubelet would change (it sets them at start unless protectKernelDefaults) and others a
# simulated node must never touch: the same before and after the whole run.
HOST_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
                "net/ipv4/conf/all/forwarding")


def host_sysctls() -> dict[str, str]:
    values = {}
    for key in HOST_SYSCTLS:
        try:
            values[key] = (Path("/proc/sys") / key).read_text().strip()
        except OSError:
            values[key] = "(unreadable)"
    return values


def node_cgroups(basetemp: Path) -> list[str]:
    """cgroups of this run's nodes still on the host: kubelet roots and workload containers, by boot id."""
    left = []
    for plan in basetemp.glob("**/nodes/*/boot.json"):
        try:
            boot = json.loads(plan.read_text()).get("boot_id", "")[:8]
        except (OSError, ValueError):
            continue
        if boot:
            left += [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/gpunode-{boot}*")]
    return sorted(left)


@pytest.fixture(scope="session", autouse=True)
def host_unchanged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After every fleet of the run is down: the host's kernel settings as before, no node cgroup left."""
    before = host_sysctls()
    yield
    after = host_sysctls()
    changed = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not changed, f"the run changed the host's kernel settings: {changed}"
    left = node_cgroups(tmp_path_factory.getbasetemp())
    assert not left, f"cgroups of this run's nodes are still on the host: {left[:10]}"
