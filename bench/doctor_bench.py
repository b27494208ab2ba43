"""Benchmark of ``gpunode doctor`` on a healthy simulated fleet (root; not part of the test suite).

    .venv/bin/python bench/doctor_bench.py          # 3 nodes
    .venv/bin/python bench/doctor_bench.py 10

Brings up a fleet on its own state folder and loopback block (127.0.41.N),
bootstraps it, then prints doctor's wall time (best and worst of five) against
the target of 10 s for 3 nodes, and tears the fleet down.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUNODE = str(REPO / ".venv" / "bin" / "gpunode")
TARGET_SECONDS = 10.0


def run(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return time.perf_counter() - started


def main(nodes: int) -> None:
    state = tempfile.mkdtemp(prefix="gpunode-bench-")
    env = {**os.environ, "GPUNODE_SIM_DIR": state, "GPUNODE_SIM_NET": "41"}
    try:
        run([GPUNODE, "sim", "up", "-n", str(nodes)], env)
        run([GPUNODE, "deploy", "inventories/sim.py", "--report", f"{state}/report.json"], env)
        times = [run([GPUNODE, "doctor", "inventories/sim.py"], env) for _ in range(5)]
    finally:
        # down even when up failed half-way; the state folder goes only through down --purge, once nothing runs
        down = subprocess.run([GPUNODE, "sim", "down", "--purge"], env=env, capture_output=True, text=True,
                              check=False)
        if down.returncode != 0:
            print(f"gpunode sim down failed; the fleet's state is kept in {state}:\n{down.stderr[-2000:]}",
                  file=sys.stderr)
    print(f"doctor on {nodes} healthy nodes: best {min(times):.2f} s, worst {max(times):.2f} s "
          f"({max(times) / TARGET_SECONDS:.0%} of the {TARGET_SECONDS:.0f} s target)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
