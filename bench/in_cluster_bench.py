"""Benchmark of ``gpunode verify --in-cluster`` against ``gpunode verify`` over SSH, on the same simulated fleet
(root; not part of the test suite).

    .venv/bin/python bench/in_cluster_bench.py            # 20 and 100 nodes
    .venv/bin/python bench/in_cluster_bench.py 20 100 200

For each size: a fleet whose containerd nodes run the simulator's node agent (GPUNODE_SIM_KUBELET=agent: 100 real
kubelets do not fit this machine), the bootstrap, then every GPU node's checker results written as the node
checker writes them (conditions, record ConfigMap), from one process that read all nodes once over SSH: the node
agent runs the device plugin's pod only. Then ``verify`` over SSH and ``verify --in-cluster``, best of three each:
the controller's wall time and CPU seconds; and ``verify --in-cluster`` called in one process whose imports are
done (best of three after a first call): the part of the command that grows with the fleet, without Python's
start-up and the imports (pyinfra, gpunode, lightkube), which take about a second here whatever the size.
The figures the node checker itself costs per node (its RSS and CPU, API requests per interval) come from the
real-kubelet fleet of the test suite (``tests/test_whole_chain.py``), not from here.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from deploy_bench import down  # bench/ is the script's folder: the same teardown as the deploy bench

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"
ADMIN_CONTEXT = "gpunode-sim"  # the fleet kubeconfig's admin: the checker's writes, as its pods would make them

PUBLISH = """
import sys
from gpunode.node_checker import CheckerState, publish
from gpunode.verify.checks import NODE_STEPS
from gpunode.verify.engine import Verification
from gpunode.verify.targets import load_inventory

targets = load_inventory("inventories/sim.py", None, {"kube_context": sys.argv[1]})
verification = Verification(targets)
verification.read_all()
for target in targets:
    results = {step: verification.result(target.name, step) for step in NODE_STEPS}
    publish(target, target.name, results, verification.facts.get(target.name, {}), 600.0, CheckerState())
print(len(targets))
"""


WARM = """
import sys, time
from gpunode.verify.run import verify

verify("inventories/sim.py", [], None, None, None, in_cluster=sys.argv[1] == "in-cluster")  # the imports, once
best = None
for _ in range(3):
    wall, cpu = time.perf_counter(), time.process_time()
    code, results = verify("inventories/sim.py", [], None, None, None, in_cluster=sys.argv[1] == "in-cluster")
    figures = (time.perf_counter() - wall, time.process_time() - cpu)
    best = min(best or figures, figures)
    if code != 0:
        raise SystemExit(f"verify found a problem: {results}")
print(f"{best[0]:.3f} {best[1]:.3f}")
"""


def controller_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: list[str], env: dict[str, str], ok: tuple[int, ...] = (0,)) -> tuple[float, float, str]:
    """(wall seconds, controller CPU seconds, output) of one command."""
    cpu = controller_seconds()
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n"
                         f"{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return elapsed, controller_seconds() - cpu, result.stdout + result.stderr


def bench(nodes: int) -> dict[str, float]:
    state = tempfile.mkdtemp(prefix="gpunode-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(GPUNODE_SIM_DIR=state, GPUNODE_SIM_NET="41", GPUNODE_SIM_KUBELET="agent", GPUNODE_SIM_CHECKER="off")
    figures: dict[str, float] = {}
    try:
        run([str(VENV / "gpunode"), "sim", "up", "-n", str(nodes)], env)
        run([str(VENV / "pyinfra"), "-y", "inventories/sim.py", "deploys/bootstrap.py"], env)
        figures["publish"] = run([str(VENV / "python"), "-c", PUBLISH, ADMIN_CONTEXT], env)[0]
        verify = [str(VENV / "gpunode"), "verify", "inventories/sim.py"]
        ssh = min(run(verify, env)[:2] for _ in range(3))
        in_cluster = min(run([*verify, "--in-cluster"], env)[:2] for _ in range(3))
        warm = run([str(VENV / "python"), "-c", WARM, "in-cluster"], env)[2].split()
        figures.update(ssh=ssh[0], ssh_cpu=ssh[1], in_cluster=in_cluster[0], in_cluster_cpu=in_cluster[1],
                       warm=float(warm[0]), warm_cpu=float(warm[1]))
        return figures
    finally:
        down(env, state)


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [20, 100]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores; best of three, controller wall / CPU seconds")
    print(f"{'nodes':>5}  {'verify (SSH)':>14}  {'verify --in-cluster':>20}  {'ratio':>6}  "
          f"{'in-cluster, imports done':>24}")
    for size in sizes:
        f = bench(size)
        print(f"{size:>5}  {f['ssh']:>6.2f}s/{f['ssh_cpu']:>5.2f}s  "
              f"{f['in_cluster']:>11.2f}s/{f['in_cluster_cpu']:>5.2f}s  {f['ssh'] / f['in_cluster']:>5.1f}x  "
              f"{f['warm']:>16.2f}s/{f['warm_cpu']:>5.2f}s", flush=True)


if __name__ == "__main__":
    main()
