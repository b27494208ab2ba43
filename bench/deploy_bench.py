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

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return elapsed, result.stdout + result.stderr


def bench(nodes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-") as state:
        env = {**os.environ, "GPUNODE_SIM_DIR": state, "GPUNODE_SIM_NET": "40"}
        run([str(VENV / "gpunode"), "sim", "up", "-n", str(nodes)], env)
        try:
            pyinfra = [str(VENV / "pyinfra"), "-y", "inventories/sim.py", "deploys/bootstrap.py"]
            first, _ = run(pyinfra, env)
            noop = min(run(pyinfra, env)[0] for _ in range(3))
            _, verbose = run([*pyinfra[:2], "-vv", *pyinfra[2:]], env)
            commands = Counter(re.findall(r"^\[(\S+)\] >>> ", verbose, re.M))
            gpu = [c for h, c in commands.items()]
            return {"first": first, "noop": noop, "max_cmds": max(gpu), "min_cmds": min(gpu)}
        finally:
            run([str(VENV / "gpunode"), "sim", "down"], env)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [3, 20]
    print(f"{'nodes':>5}  {'first run':>10}  {'no-op re-run':>12}  {'no-op commands/host':>20}")
    for size in sizes:
        figures = bench(size)
        print(f"{size:>5}  {figures['first']:>9.1f}s  {figures['noop']:>11.2f}s  "
              f"{figures['min_cmds']:>9}-{figures['max_cmds']} (CPU-GPU)")


if __name__ == "__main__":
    main()
