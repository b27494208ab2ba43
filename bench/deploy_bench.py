"""Benchmark of the bootstrap deploy on the simulated fleet (root; not part of the test suite).

    .venv/bin/python bench/deploy_bench.py            # 3 and 20 nodes
    .venv/bin/python bench/deploy_bench.py 3

For each fleet size it prints the first-run wall time, the no-op re-run wall time
(best of three) and the remote commands per host on a no-op re-run. The fleet
runs on its own state folder and loopback block (127.0.40.N) and is torn down.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from gpunode.sim.fleet import inotify_in_use, inotify_limit, inotify_shortfall

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return elapsed, result.stdout + result.stderr


def bench(nodes: int) -> dict[str, float | str]:
    """One fleet of ``nodes``: up, first run, no-op re-runs, commands per host; always brought down again.

    Where the host's inotify instances do not suffice for that many real kubelets, the containerd nodes run the
    simulator's node agent (GPUNODE_SIM_KUBELET=agent) and the row says so.
    """
    state = tempfile.mkdtemp(prefix="gpunode-bench-")
    env = {**os.environ, "GPUNODE_SIM_DIR": state, "GPUNODE_SIM_NET": "40"}
    kubelet = "real"
    if inotify_shortfall(nodes - nodes // 4, inotify_limit(), inotify_in_use()):  # 3 of every 4 use containerd
        env["GPUNODE_SIM_KUBELET"] = kubelet = "agent"
    try:
        run([str(VENV / "gpunode"), "sim", "up", "-n", str(nodes)], env)
        pyinfra = [str(VENV / "pyinfra"), "-y", "inventories/sim.py", "deploys/bootstrap.py"]
        first, _ = run(pyinfra, env)
        noop = min(run(pyinfra, env)[0] for _ in range(3))
        _, verbose = run([*pyinfra[:2], "-vv", *pyinfra[2:]], env)
        commands = Counter(re.findall(r"^\[(\S+)\] >>> ", verbose, re.M))
        gpu = list(commands.values())
        return {"first": first, "noop": noop, "max_cmds": max(gpu), "min_cmds": min(gpu), "kubelet": kubelet}
    finally:
        # down even when up failed half-way; the state folder goes only once nothing runs from it
        down = subprocess.run([str(VENV / "gpunode"), "sim", "down", "--purge"], cwd=REPO, env=env,
                              capture_output=True, text=True, check=False)
        if down.returncode != 0:
            print(f"gpunode sim down failed; the fleet's state is kept in {state}:\n{down.stderr[-2000:]}",
                  file=sys.stderr)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [3, 20]
    print(f"{'nodes':>5}  {'first run':>10}  {'no-op re-run':>12}  {'no-op commands/host':>20}  kubelet")
    for size in sizes:
        figures = bench(size)
        print(f"{size:>5}  {figures['first']:>9.1f}s  {figures['noop']:>11.2f}s  "
              f"{figures['min_cmds']:>9}-{figures['max_cmds']} (CPU-GPU)  {figures['kubelet']}")


if __name__ == "__main__":
    main()
