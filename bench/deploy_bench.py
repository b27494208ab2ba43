"""Benchmark of the bootstrap, verify and doctor on the simulated fleet (root; not part of the test suite).

    .venv/bin/python bench/deploy_bench.py              # 3 and 20 nodes
    .venv/bin/python bench/deploy_bench.py 20 50 100    # issue 16's sizes
    .venv/bin/python bench/deploy_bench.py --no-ansible --profile 100

For each fleet size: the first run's wall time, the no-op re-run's (best of
three), the remote commands per host on a no-op, ``gpunode verify`` and
``gpunode doctor`` (best of two), and the CPU seconds the no-op cost the whole
machine (controller, simulated nodes, control plane) and the controller alone.
At 20 nodes (unless --no-ansible) it times the node steps against the Ansible playbook in bench/ansible/ on the
same fleet, alternating, and prints the ratio of the medians. With --profile
the largest size's no-op runs once under cProfile and the controller's time is
printed per package.

Each fleet runs on its own state folder and loopback block (127.0.40.N) and is
torn down whatever happens. Commands run without PYTHONDONTWRITEBYTECODE, as on
an operator's machine (bytecode caches are written once and reused).
"""

from __future__ import annotations

import os
import pstats
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from gpunode_sim.fleet import inotify_in_use, inotify_limit, inotify_shortfall

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv" / "bin"
ANSIBLE_DIR = REPO / "bench" / "ansible"
ANSIBLE_VENV = REPO / ".venv-ansible"
ANSIBLE_ROUNDS = 5
# Ansible's apt module needs python3-apt on the node; the simulated nodes have no Debian mirror, so the bench
# brings these (fetched on this machine) before Ansible's first run. Not timed.
PYTHON_APT = ("python3-apt", "python-apt-common", "distro-info-data")


def cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (every process: controller, nodes, control plane)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def controller_seconds() -> float:
    """CPU seconds of the commands this bench ran and waited for (pyinfra and its SSH connections are one process)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def settle(seconds: float = 5.0, limit: float = 120.0) -> float:
    """Wait until the fleet idles after the first run (a rollout's pods starting, the kubelets' first syncs):
    the machine's busy cores, averaged over ``seconds``, stop falling. Returns that idle load in cores.

    An operator re-runs the bootstrap on a fleet that has settled; measured straight after the first run, the
    no-op also paid for the rollout's tail (about a second at 20 nodes).
    """
    deadline = time.monotonic() + limit
    previous = None
    while True:
        before = cpu_seconds()
        time.sleep(seconds)
        load = (cpu_seconds() - before) / seconds
        if (previous is not None and load >= previous * 0.9) or time.monotonic() > deadline:
            return load
        previous = load


def run(argv: list[str], env: dict[str, str], cwd: Path = REPO, ok: tuple[int, ...] = (0,)) -> tuple[float, str]:
    started = time.perf_counter()
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if result.returncode not in ok:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n"
                         f"{result.stdout[-3000:]}{result.stderr[-2000:]}")
    return elapsed, result.stdout + result.stderr


def ansible_ready(env: dict[str, str], state: str) -> list[str]:
    """ansible-playbook's argv for this fleet: its own virtualenv, its inventory, python3-apt on the nodes."""
    if not (ANSIBLE_VENV / "bin" / "ansible-playbook").exists():
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", "-r",
                        str(ANSIBLE_DIR / "requirements.txt")], check=True)
    debs = Path(state) / "debs"
    debs.mkdir(exist_ok=True)
    subprocess.run(["apt-get", "download", "-q", *PYTHON_APT], cwd=debs, check=True, capture_output=True)
    ssh_config = Path(state) / "ssh" / "config"
    hosts = [h for h in re.findall(r"^Host (\S+)", ssh_config.read_text(), re.M) if h != "bastion"]

    def install(host: str) -> None:
        subprocess.run(["scp", "-q", "-F", str(ssh_config), *map(str, debs.glob("*.deb")), f"{host}:/tmp/"],
                       check=True)
        subprocess.run(["ssh", "-F", str(ssh_config), host, "sudo dpkg -i /tmp/*.deb >/dev/null && rm -f /tmp/*.deb"],
                       check=True)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(install, hosts))
    inventory = Path(state) / "ansible-inventory.yml"
    run([str(VENV / "python"), str(ANSIBLE_DIR / "inventory.py"), str(inventory)], env)
    return [str(ANSIBLE_VENV / "bin" / "ansible-playbook"), "-i", str(inventory), "bootstrap.yml"]


def ansible_changes(output: str) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", output))


def compare_ansible(env: dict[str, str], state: str) -> dict[str, float | int]:
    """Node steps, gpunode against Ansible, on the converged fleet: no-op re-runs alternating, medians."""
    playbook = ansible_ready(env, state)
    ansible_env = {**env, "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
                   "ANSIBLE_LOCAL_TEMP": f"{state}/ansible-tmp", "ANSIBLE_SSH_CONTROL_PATH_DIR": f"{state}/ansible-cp"}
    first, output = run(playbook, ansible_env, cwd=ANSIBLE_DIR)  # Ansible's own first pass over gpunode's state
    first_changes = ansible_changes(output)
    node_steps = [str(VENV / "pyinfra"), "-y", "--data", "cluster_steps=False", "inventories/sim.py",
                  "deploys/bootstrap.py"]
    ours, theirs, changes = [], [], 0
    for _ in range(ANSIBLE_ROUNDS):
        ours.append(run(node_steps, env)[0])
        elapsed, output = run(playbook, ansible_env, cwd=ANSIBLE_DIR)
        theirs.append(elapsed)
        changes += ansible_changes(output)
    # Ansible's persistent SSH masters would outlive the run (ControlPersist): end them with it
    subprocess.run(["pkill", "-f", f"{state}/ansible-cp"], check=False)
    return {"gpunode": statistics.median(ours), "ansible": statistics.median(theirs),
            "ansible_first_changes": first_changes, "ansible_noop_changes": changes, "ansible_first": first}


def profile_noop(env: dict[str, str]) -> str:
    """One no-op under cProfile in this process's child: the controller's own time per package, largest first."""
    with tempfile.NamedTemporaryFile(suffix=".prof", delete=False) as handle:
        out = handle.name
    run([str(VENV / "python"), "-m", "cProfile", "-o", out, str(VENV / "pyinfra"), "-y", "inventories/sim.py",
         "deploys/bootstrap.py"], env)
    stats = pstats.Stats(out)
    per_package: Counter[str] = Counter()
    for (filename, _, function), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        if "site-packages/" in filename:
            package = filename.split("site-packages/")[1].split("/")[0]
        elif "/src/gpunode/" in filename:
            package = "gpunode"
        elif filename == "~":
            package = f"builtin {function.split(' of ')[0].strip('<>')}"
        else:
            package = "python " + Path(filename).stem
        per_package[package] += tottime
    os.unlink(out)
    total = sum(per_package.values())
    lines = [f"    {seconds:6.2f} s {seconds / total:5.1%}  {package}"
             for package, seconds in per_package.most_common(12)]
    return f"controller profile of the no-op (cProfile, {total:.1f} s under the profiler):\n" + "\n".join(lines)


def bench(nodes: int, ansible: bool, profile: bool) -> dict[str, object]:
    """One fleet of ``nodes``: up, first run, no-op re-runs, commands per host, verify, doctor; always brought down.

    Where the host's inotify instances do not suffice for that many real kubelets, the containerd nodes run the
    simulator's node agent (GPUNODE_SIM_KUBELET=agent) and the row says so.
    """
    state = tempfile.mkdtemp(prefix="gpunode-bench-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    # the node checker's pods off: the figures stay comparable with the runs before it existed
    env.update(GPUNODE_SIM_DIR=state, GPUNODE_SIM_NET="40", GPUNODE_SIM_CHECKER="off")
    kubelet = "real"
    if inotify_shortfall(nodes - nodes // 4, inotify_limit(), inotify_in_use()):  # 3 of every 4 use containerd
        env["GPUNODE_SIM_KUBELET"] = kubelet = "agent"
    figures: dict[str, object] = {"kubelet": kubelet}
    try:
        figures["up"] = run([str(VENV / "gpunode"), "sim", "up", "-n", str(nodes)], env)[0]
        pyinfra = [str(VENV / "pyinfra"), "-y", "inventories/sim.py", "deploys/bootstrap.py"]
        figures["first"] = run(pyinfra, env)[0]
        figures["idle"] = settle()
        noops = []
        for _ in range(3):
            before, controller = cpu_seconds(), controller_seconds()
            elapsed = run(pyinfra, env)[0]
            noops.append((elapsed, cpu_seconds() - before, controller_seconds() - controller))
        figures["noop"], figures["noop_cpu"], figures["noop_controller"] = min(noops)
        _, verbose = run([*pyinfra[:2], "-vv", *pyinfra[2:]], env)
        commands = Counter(re.findall(r"^\[(\S+)\] >>> ", verbose, re.M))
        figures["cmds"] = f"{min(commands.values())}-{max(commands.values())}"
        figures["verify"] = min(run([str(VENV / "gpunode"), "verify", "inventories/sim.py"], env)[0]
                                for _ in range(2))
        figures["doctor"] = min(run([str(VENV / "gpunode"), "doctor", "inventories/sim.py"], env)[0]
                                for _ in range(2))
        if ansible:
            figures["ansible"] = compare_ansible(env, state)
        if profile:
            figures["profile"] = profile_noop(env)
        return figures
    finally:
        down(env, state)


def down(env: dict[str, str], state: str) -> None:
    """The bench's fleet down, even when up failed half-way; the state folder goes only once nothing runs from it."""
    result = subprocess.run([str(VENV / "gpunode"), "sim", "down", "--purge"], cwd=REPO, env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        print(f"gpunode sim down failed; the fleet's state is kept in {state}:\n{result.stderr[-2000:]}",
              file=sys.stderr)


def main() -> None:
    args = sys.argv[1:]
    ansible = "--no-ansible" not in args
    profile = "--profile" in args
    sizes = [int(a) for a in args if not a.startswith("--")] or [3, 20]
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores")
    print(f"{'nodes':>5}  {'up':>6}  {'first run':>9}  {'idle':>5}  {'no-op':>6}  {'CPU all/ctl':>12}  "
          f"{'cmds/host':>9}  {'verify':>6}  {'doctor':>6}  kubelet")
    notes = []
    for size in sizes:
        figures = bench(size, ansible and size == 20, profile and size == max(sizes))
        print(f"{size:>5}  {figures['up']:>5.0f}s  {figures['first']:>8.1f}s  {figures['idle']:>5.2f}  "
              f"{figures['noop']:>5.2f}s  "
              f"{figures['noop_cpu']:>5.1f}s/{figures['noop_controller']:>4.1f}s  {figures['cmds']:>9}  "
              f"{figures['verify']:>5.2f}s  "
              f"{figures['doctor']:>5.2f}s  {figures['kubelet']}", flush=True)
        if "ansible" in figures:
            a = figures["ansible"]
            notes.append(f"node steps no-op at {size} nodes, medians of {ANSIBLE_ROUNDS} alternating runs: gpunode "
                         f"{a['gpunode']:.2f} s, Ansible {a['ansible']:.2f} s: {a['ansible'] / a['gpunode']:.1f}x "
                         f"(Ansible's first pass over gpunode's state: {a['ansible_first']:.1f} s, "
                         f"{a['ansible_first_changes']} changes; its no-op re-runs: {a['ansible_noop_changes']} "
                         "changes)")
        if "profile" in figures:
            notes.append(f"{size} nodes, {figures['profile']}")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
