"""Benchmark of the device plugin against the kubelet stand-in (not part of the test suite).

    .venv/bin/python bench/plugin_bench.py

Prints: Register round trip (dial-back included), re-registration latency after
kubelet.sock is recreated (target p99 < 1 s), Allocate p50/p99 for 1 and 8 GPUs
(target p99 < 5 ms), health event to ListAndWatch update (target < 1 s), and the
plugin's steady-state RSS (target < 60 MiB; NVIDIA's Go plugin is ~25 MiB).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.plugin_harness import PluginRun  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="plugin-bench-") as tmp:
        run = PluginRun(Path(tmp), profile="h100x8-nvswitch", args=("--log-format", "json")).start()
        try:
            if not run.wait_registered():
                sys.exit(run.output())
            restarts = []
            for _ in range(100):
                started = time.monotonic()
                run.kubelet.restart()
                run.wait_registered(timeout=5)
                restarts.append(time.monotonic() - started)
            ids = [g["uuid"] for g in run.gpus]
            allocate = {}
            for size in (1, 8):
                samples = []
                for _ in range(500):
                    started = time.perf_counter()
                    run.kubelet.allocate("nvidia.com/gpu", ids[:size])
                    samples.append(time.perf_counter() - started)
                allocate[size] = samples
            health = []
            for index, uuid in enumerate(ids):
                started = time.monotonic()
                run.inject(f"{uuid} 79")
                run.wait_registered(count=len(ids) - index - 1, timeout=5)
                health.append(time.monotonic() - started)
            if run.process is None:
                sys.exit("the plugin did not start")
            rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{run.process.pid}/status").read_text()
                           .splitlines() if line.startswith("VmRSS:"))
            register = run.kubelet.register_seconds
        finally:
            run.stop()
    print(f"Register round trip (dial-back included): p50 {statistics.median(register) * 1000:.1f} ms, "
          f"p99 {pct(register, .99) * 1000:.1f} ms over {len(register)}")
    print(f"re-registration after kubelet.sock recreated: p50 {statistics.median(restarts) * 1000:.0f} ms, "
          f"p99 {pct(restarts, .99) * 1000:.0f} ms over 100 restarts (target p99 < 1000 ms)")
    for size, samples in allocate.items():
        print(f"Allocate {size} GPU(s): p50 {statistics.median(samples) * 1000:.2f} ms, "
              f"p99 {pct(samples, .99) * 1000:.2f} ms over {len(samples)} (target p99 < 5 ms)")
    print(f"health event to ListAndWatch update: max {max(health) * 1000:.0f} ms over {len(health)} Xid 79 events "
          "(target < 1000 ms)")
    print(f"plugin RSS after the run: {rss_kib / 1024:.1f} MiB (target < 60 MiB)")


if __name__ == "__main__":
    main()
