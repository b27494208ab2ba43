"""What a machine with a real NVIDIA GPU must confirm, in one short run (under 5 minutes, no Kubernetes).

    PYTHONPATH=plugin:sim:src python3 bench/real_gpu_check.py [--out DIR]

Prints one line per check (``ok``, ``FAIL`` or ``not checked``, the check's name, what was seen) and writes
the raw captures of the real ``nvidia-smi`` under ``--out`` (default ``$OUT``, else ``real-gpu-captures``), next
to what the simulator's stand-in prints for the same queries, for the next session to compare byte by byte:

1. driver: ``nvidia-smi`` answers the query gpunode's driver fact runs;
2. nvml: the plugin's production backend (``--backend nvml``: nvidia-ml-py over ``libnvidia-ml.so.1``) finds
   the same GPUs as ``nvidia-smi`` (UUID, name, memory, PCI bus id);
3. plugin: the plugin's real process with the NVML backend registers with the kubelet stand-in over real unix
   sockets, offers every GPU, and Allocate for one GPU answers NVIDIA_VISIBLE_DEVICES with its UUID;
4. rss: the plugin's resident memory after registration (the issue's goal: under 40 MiB);
5. captures: the query formats the stand-in imitates, saved, and their column counts compared.

Needs grpcio, protobuf, nvidia-ml-py and pyyaml importable (``pip install --target DIR`` them and add DIR to
PYTHONPATH where the machine has no package index). Exit 0 when nothing failed (``not checked`` is not a failure).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUERY = "index,name,uuid,memory.total,driver_version,pci.bus_id,compute_cap,mig.mode.current"  # the driver fact's
HEALTH = "index,ecc.errors.uncorrected.volatile.total,retired_pages.pending,compute_mode"
CAPTURES = {  # file name: nvidia-smi arguments (what gpunode's facts and the stand-in speak)
    "nvidia-smi-L.txt": ["-L"],
    "query-gpu.csv": [f"--query-gpu={QUERY}", "--format=csv,noheader"],
    "query-health.csv": [f"--query-gpu={HEALTH}", "--format=csv,noheader"],
    "query-remapped-rows.csv": ["--query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure",
                                "--format=csv,noheader"],
    "nvidia-smi.txt": [],
    "q-ecc.txt": ["-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER"],
}
failed: list[str] = []


def line(state: str, name: str, detail: str) -> None:
    if state == "FAIL":
        failed.append(name)
    print(f"{state:<12} {name:<9} {detail}", flush=True)


def smi(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60, check=False)


def driver() -> list[dict[str, str]] | None:
    if shutil.which("nvidia-smi") is None:
        line("not checked", "driver", "nvidia-smi is not on PATH (no NVIDIA driver here)")
        return None
    result = smi([f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"])
    if result.returncode != 0:
        line("FAIL", "driver", f"nvidia-smi exit {result.returncode}: {(result.stderr or result.stdout).strip()[:300]}")
        return None
    keys = QUERY.split(",")
    gpus = [dict(zip(keys, (v.strip() for v in row.split(",")), strict=False))
            for row in result.stdout.splitlines() if row.strip()]
    line("ok", "driver", f"{len(gpus)} GPU(s): " + "; ".join(f"{g['index']} {g['name']} {g['uuid']} "
                                                                f"driver {g['driver_version']}" for g in gpus))
    return gpus


def nvml(gpus: list[dict[str, str]] | None) -> None:
    if gpus is None:
        line("not checked", "nvml", "no driver (above)")
        return
    try:
        from gpunode_plugin.nvml_backend import NvmlBackend
    except ImportError as error:
        line("not checked", "nvml", f"the plugin or nvidia-ml-py is not importable: {error}")
        return
    backend = NvmlBackend()
    try:
        backend.start()
        found = backend.gpus()
    except Exception as error:  # noqa: BLE001 - every failure is this check's finding
        line("FAIL", "nvml", f"{type(error).__name__}: {error}")
        return
    finally:
        try:
            backend.stop()
        except Exception:  # noqa: BLE001, S110 - stopping after a failed start
            pass
    seen = {g.uuid: g for g in found}
    wrong = []
    for gpu in gpus:
        mine = seen.get(gpu["uuid"])
        if mine is None:
            wrong.append(f"{gpu['uuid']} missing")
            continue
        if mine.name != gpu["name"]:
            wrong.append(f"{gpu['uuid']} name {mine.name!r} != {gpu['name']!r}")
        if mine.pci_bus_id.lower()[-12:] != gpu["pci.bus_id"].lower()[-12:]:
            wrong.append(f"{gpu['uuid']} bus {mine.pci_bus_id} != {gpu['pci.bus_id']}")
        if abs(mine.memory_mib - int(float(gpu["memory.total"]))) > 1:
            wrong.append(f"{gpu['uuid']} memory {mine.memory_mib} != {gpu['memory.total']}")
    if wrong or len(found) != len(gpus):
        line("FAIL", "nvml", f"NVML found {len(found)}, nvidia-smi {len(gpus)}: " + "; ".join(wrong))
    else:
        line("ok", "nvml", f"the NVML backend finds the same {len(found)} GPU(s): UUID, name, memory, PCI bus id")


def rss_mib(pid: int) -> float:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1]) / 1024
    return 0.0


def plugin(gpus: list[dict[str, str]] | None) -> None:
    if gpus is None:
        line("not checked", "plugin", "no driver (above)")
        line("not checked", "rss", "no driver (above)")
        return
    try:
        from gpunode_sim.guest.device_manager import KubeletStandin
    except ImportError as error:
        line("not checked", "plugin", f"the kubelet stand-in is not importable: {error}")
        line("not checked", "rss", "the plugin did not run")
        return
    sockets = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
    kubelet = KubeletStandin(str(sockets))
    kubelet.start()
    log = sockets / "plugin.log"
    process = subprocess.Popen([sys.executable, "-m", "gpunode_plugin", "--backend", "nvml",
                                "--kubelet-socket", str(sockets / "kubelet.sock"), "--http-address", "127.0.0.1:0"],
                               stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        registered = kubelet.wait_for(lambda k: k.allocatable("nvidia.com/gpu") == len(gpus), timeout=60)
        took = time.monotonic() - started
        if not registered:
            said = log.read_text(errors="replace").strip().splitlines()[-3:]
            line("FAIL", "plugin", f"offers {kubelet.allocatable('nvidia.com/gpu')} of {len(gpus)} GPU(s) after 60 s; "
                 f"its log: {' | '.join(said)}")
            line("not checked", "rss", "the plugin did not register")
            return
        device = gpus[0]["uuid"]
        answer = kubelet.allocate("nvidia.com/gpu", [device])
        envs = dict(answer.container_responses[0].envs)
        if envs.get("NVIDIA_VISIBLE_DEVICES") == device:
            line("ok", "plugin", f"registered and offered {len(gpus)} GPU(s) in {took:.1f} s; Allocate gave "
                 f"NVIDIA_VISIBLE_DEVICES={device}")
        else:
            line("FAIL", "plugin", f"Allocate of {device} answered {envs}")
        rss = rss_mib(process.pid)
        line("ok" if rss < 40 else "FAIL", "rss", f"{rss:.1f} MiB resident after registration (goal < 40 MiB)")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        kubelet.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def captures(gpus: list[dict[str, str]] | None, out: Path) -> None:
    if gpus is None:
        line("not checked", "captures", "no driver (above)")
        return
    out.mkdir(parents=True, exist_ok=True)
    saved, differ = [], []
    standin = Path(__file__).resolve().parents[1] / "sim/gpunode_sim/standins/nvidia_smi.py"
    for name, args in CAPTURES.items():
        real = smi(args)
        (out / name).write_text(real.stdout + (f"\n# stderr:\n{real.stderr}" if real.stderr else "")
                                + f"\n# exit {real.returncode}\n")
        saved.append(name)
        if name.endswith(".csv") and real.returncode == 0 and standin.is_file():
            ours = subprocess.run([sys.executable, str(standin), *args], capture_output=True, text=True,
                                  timeout=60, check=False)
            (out / f"standin-{name}").write_text(ours.stdout + ours.stderr)
            real_cols = {row.count(",") for row in real.stdout.splitlines() if row.strip()}
            our_cols = {row.count(",") for row in ours.stdout.splitlines() if row.strip()}
            if our_cols and real_cols != our_cols:
                differ.append(f"{name}: {sorted(real_cols)} commas, the stand-in {sorted(our_cols)}")
    line("FAIL" if differ else "ok", "captures", f"{len(saved)} saved in {out}" +
         (f"; columns differ: {'; '.join(differ)}" if differ else "; the stand-in's CSV columns agree"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "real-gpu-captures",
                        help="where the captures go (default: $OUT, else real-gpu-captures)")
    out = Path(parser.parse_args().out)
    started = time.monotonic()
    gpus = driver()
    nvml(gpus)
    plugin(gpus)
    captures(gpus, out)
    print(f"{'FAIL' if failed else 'ok':<12} {'all':<9} {time.monotonic() - started:.1f} s"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
