"""The device plugin's image under the real kubelet (root; not part of the test suite).

    .venv/bin/python bench/kubelet_bench.py          # 20 kubelet restarts, 20 GPU pods

Brings up one A100 x4 containerd node (real kubelet v1.35) on its own state
folder and loopback block (127.0.42.N), bootstraps it, then prints:

* the plugin image's size (archive and layers);
* the plugin's RSS and threads in its container, and the kubelet's RSS;
* re-registration after a real kubelet restart: from the new kubelet's
  registration socket (its mtime) to the kubelet logging the plugin's
  registration request, p50/p99;
* GPU pod start through the real kubelet (admission, Allocate, CRI, the nvidia
  runtime): the kubelet's own podStartSLOduration, p50/p99 (the pods run 2 s,
  so the kubelet sees them running; it logs only those);
* Allocate as the kubelet's device manager times it (its own histogram,
  kubelet_device_plugin_alloc_duration_seconds): calls, mean, the p99's bucket;
* the idle CPU of the node's kubelet and plugin over 20 s;
* an Xid 79 through NVML's event set (the simulated libnvidia-ml.so.1) to the
  plugin's "unhealthy" verdict (its log line, as the CRI stamps it) and to the
  kubelet's allocatable count one lower, once per GPU.

and tears the fleet down.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPUNODE = str(REPO / ".venv" / "bin" / "gpunode")
CACHE = Path("/var/cache/gpunode")
RESTART = """old=$(pgrep -x kubelet); systemctl restart kubelet; new=$(pgrep -x kubelet)
for i in $(seq 1 200); do
  line=$(journalctl -u kubelet | grep " $new server.go.*Got registration request from device plugin" | tail -1)
  [ -n "$line" ] && break; sleep 0.05
done
echo "socket=$(date -r /var/lib/kubelet/device-plugins/kubelet.sock +%s.%N)"; echo "registered=$line"
"""


def run(argv: list[str], env: dict[str, str], check: bool = True) -> str:
    result = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def klog_time(line: str) -> float:
    stamp = re.match(r"[IWE](\d{4} \d\d:\d\d:\d\d\.\d+)", line)
    if not stamp:
        raise ValueError(line)
    moment = datetime.datetime.strptime(f"{datetime.datetime.now(datetime.UTC).year}{stamp.group(1)}",
                                        "%Y%m%d %H:%M:%S.%f")
    return moment.replace(tzinfo=datetime.UTC).timestamp()


ALLOC = "kubelet_device_plugin_alloc_duration_seconds"  # the kubelet's device manager times each Allocate call


def allocate_line(metrics: str) -> str:
    """Allocate as the kubelet's device manager times it (its histogram for nvidia.com/gpu): the calls, their mean,
    and the bucket bound that holds 99% of them (a histogram gives no finer p99)."""
    labels = 'resource_name="nvidia.com/gpu"'
    buckets = [(float(le), float(count)) for le, count in re.findall(
        rf'^{ALLOC}_bucket{{[^}}]*{labels}[^}}]*le="([^"]+)"}} (\S+)$', metrics, re.MULTILINE)]
    total = re.search(rf"^{ALLOC}_sum{{[^}}]*{labels}[^}}]*}} (\S+)$", metrics, re.MULTILINE)
    count = re.search(rf"^{ALLOC}_count{{[^}}]*{labels}[^}}]*}} (\S+)$", metrics, re.MULTILINE)
    if not (buckets and total and count and float(count.group(1))):
        return f"Allocate through the real kubelet: no {ALLOC} samples for nvidia.com/gpu in the kubelet's metrics"
    calls = float(count.group(1))
    p99 = min(le for le, below in buckets if below >= 0.99 * calls)
    return (f"Allocate through the real kubelet ({ALLOC}, {calls:.0f} calls): mean "
            f"{float(total.group(1)) / calls * 1000:.1f} ms, p99 <= {p99 * 1000:g} ms (the histogram's bucket)")


def main(rounds: int) -> None:
    image = max(CACHE.glob("plugin-image-*/image.json"), key=lambda p: p.stat().st_mtime)
    described = json.loads(image.read_text())
    print(f"plugin image {described['name']}: archive {described['archive_bytes'] / 2**20:.0f} MiB "
          f"(layers: base {described['layers_bytes'][0] / 2**20:.0f} MiB, plugin "
          f"{described['layers_bytes'][1] / 2**20:.0f} MiB)")
    with tempfile.TemporaryDirectory(prefix="gpunode-bench-") as state:
        env = {**os.environ, "GPUNODE_SIM_DIR": state, "GPUNODE_SIM_NET": "42"}
        run([GPUNODE, "sim", "up", "-n", "1", "--profile", "node01=a100x4-containerd"], env)
        ssh = ["ssh", "-F", f"{state}/ssh/config", "node01"]
        try:
            run([GPUNODE, "deploy", "inventories/sim.py", "--report", f"{state}/report.json"], env)
            usage = run([*ssh, "for p in $(pgrep -f 'python3 -m gpunode_plugin' | head -1) $(pgrep -x kubelet); do "
                               "echo $(cat /proc/$p/comm) $(sudo awk '/VmRSS|Threads/ {print $2}' /proc/$p/status) "
                               "$(awk '{print $14 + $15}' /proc/$p/stat); done"], env)
            rows = [line.split() for line in usage.splitlines()]
            ticks = os.sysconf("SC_CLK_TCK")
            time.sleep(20)
            later = run([*ssh, "for p in $(pgrep -f 'python3 -m gpunode_plugin' | head -1) $(pgrep -x kubelet); do "
                               "echo $(awk '{print $14 + $15}' /proc/$p/stat); done"], env).split()
            for row, cpu in zip(rows, later, strict=False):
                print(f"{row[0]}: RSS {int(row[1]) / 1024:.0f} MiB, {row[2]} threads, idle CPU "
                      f"{(int(cpu) - int(row[3])) / ticks / 20:.1%} of a core")
            run([*ssh, f"cat > /tmp/restart <<'EOF'\n{RESTART}\nEOF"], env)
            latencies = []
            for _ in range(rounds):
                out = dict(re.findall(r"^(\w+)=(.*)$", run([*ssh, "sudo sh /tmp/restart"], env), re.MULTILINE))
                if out.get("registered"):
                    latencies.append(klog_time(out["registered"]) - float(out["socket"]))
                time.sleep(1)
            print(f"re-registration after a real kubelet restart ({len(latencies)}/{rounds}): "
                  f"p50 {percentile(latencies, 0.5) * 1000:.0f} ms, p99 {percentile(latencies, 0.99) * 1000:.0f} ms")
            for index in range(rounds):
                run([GPUNODE, "sim", "run", f"pod{index}", "--", "sh", "-c", "nvidia-smi -L; sleep 2"], env)
            log = run([*ssh, "sudo journalctl -u kubelet | grep 'Observed pod startup duration' "
                             "| grep 'pod=\"default/'"], env)
            starts = [float(v) for v in re.findall(r"podStartSLOduration=([\d.]+)", log)]
            print(f"GPU pod start through the real kubelet ({len(starts)} pods, Allocate included): "
                  f"p50 {percentile(starts, 0.5) * 1000:.0f} ms, p99 {percentile(starts, 0.99) * 1000:.0f} ms")
            metrics = run([GPUNODE, "sim", "kubectl", "get", "--raw", "/api/v1/nodes/node01/proxy/metrics"], env)
            print(allocate_line(metrics))
            gpus = json.loads(run([*ssh, "cat /etc/gpunode-sim/gpu.json"], env))["gpus"]
            verdicts, offers = [], []
            for left, gpu in zip(range(len(gpus) - 1, -1, -1), gpus, strict=True):
                sent = float(run([*ssh, f"sudo sh -c 'date +%s.%N; echo \"{gpu['uuid']} 79\" >> "
                                        "/run/gpunode-sim/events/health-events'"], env))
                line = ""
                for _ in range(300):
                    said = f"device {gpu['uuid']} of nvidia.com/gpu unhealthy"
                    line = run([*ssh, f"sudo sh -c 'cat /var/log/pods/gpunode-system_*/*/*.log' | grep '{said}' "
                                      "| head -1"], env, check=False)
                    if line:
                        break
                    time.sleep(0.1)
                if line:
                    verdicts.append(datetime.datetime.fromisoformat(line.split()[0]).timestamp() - sent)
                for _ in range(600):
                    count = run([GPUNODE, "sim", "kubectl", "get", "node", "node01", "-o",
                                 "jsonpath={.status.allocatable.nvidia\\.com/gpu}"], env, check=False).strip()
                    if count == str(left):
                        offers.append(time.time() - sent)
                        break
                    time.sleep(0.1)
            print(f"Xid 79 to the plugin's unhealthy verdict ({len(verdicts)}/{len(gpus)} GPUs): "
                  f"max {max(verdicts, default=0) * 1000:.0f} ms; to the kubelet's allocatable one lower "
                  f"({len(offers)}/{len(gpus)}): p50 {percentile(offers, 0.5):.1f} s, max {max(offers):.1f} s"
                  if offers else f"Xid 79: the kubelet's allocatable never dropped ({len(verdicts)} verdicts)")
        finally:
            run([GPUNODE, "sim", "down"], env, check=False)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
