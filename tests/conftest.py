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
    return {**os.environ, "GPUNODE_SIM_DIR": str(state), "GPUNODE_SIM_NET": str(net_block), "PYTHONUNBUFFERED": "1"}


@pytest.fixture(scope="session")
def fleet(sim_env: dict[str, str]) -> Iterator[dict]:
    """Three running nodes (A100/containerd, V100/docker, CPU-only), torn down at the end."""
    up = gpunode("sim", "up", "--json", env=sim_env)
    info = json.loads(up.stdout)
    info["env"] = sim_env
    info["up_stderr"] = up.stderr
    try:
        yield info
    finally:
        gpunode("sim", "down", env=sim_env, check=False)
