"""Runs the plugin's real entry point against the kubelet stand-in over real unix sockets."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from gpunode_sim.guest.device_manager import KubeletStandin
from gpunode_sim.spec.gpus import driver_state
from gpunode_sim.spec.profiles import load_profile


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PluginRun:
    """A kubelet stand-in plus a ``gpunode-device-plugin`` process on a simulated node's GPU state."""

    def __init__(self, tmp: Path, profile: str | dict = "a100x4-containerd", node: str = "node01",
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None, gpu_edit: object = None) -> None:
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.state_file = tmp / "gpu.json"
        self.events_file = tmp / "health-events"
        data = load_profile(profile) if isinstance(profile, str) else profile
        state = driver_state(node, data)
        if gpu_edit:
            gpu_edit(state)  # type: ignore[operator]
        self.state_file.write_text(json.dumps(state))
        self.gpus = state["gpus"]
        # unix socket paths are limited to 107 bytes: keep the socket directory short
        self.socket_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))
        self.kubelet = KubeletStandin(str(self.socket_dir))
        self.port = free_port()
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen[str] | None = None
        self.log = tmp / "plugin.log"

    def start(self, kubelet: bool = True, wrapper: tuple[str, ...] = ()) -> PluginRun:
        if kubelet:
            self.kubelet.start()
        argv = [*wrapper, sys.executable, "-m", "gpunode_plugin", "--backend", "sim",
                "--sim-state-file", str(self.state_file),
                "--sim-events-file", str(self.events_file), "--kubelet-socket", str(self.socket_dir / "kubelet.sock"),
                "--http-address", f"127.0.0.1:{self.port}", *self.args]
        self.process = subprocess.Popen(argv, env=self.env, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
                                        text=True)
        return self

    def wait_registered(self, resource: str = "nvidia.com/gpu", count: int | None = None,
                        timeout: float = 15) -> bool:
        want = len(self.gpus) if count is None else count
        return self.kubelet.wait_for(lambda k: k.allocatable(resource) == want, timeout)

    def inject(self, line: str) -> None:
        with self.events_file.open("a") as handle:
            handle.write(line + "\n")

    def http(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def wait_http(self, path: str, timeout: float = 10) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.http(path)
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text()

    def stop(self) -> int | None:
        code = None
        if self.process and self.process.poll() is None:
            self.process.terminate()
            code = self.process.wait(15)
        elif self.process:
            code = self.process.returncode
        self.kubelet.stop()
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        return code

    def stop_plugin(self) -> int | None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            return self.process.wait(15)
        return self.process.returncode if self.process else None
