"""The kubelet side of a simulated node: runs inside the node, started by the simulated control plane.

It serves the kubelet's device-plugin Registration API (the kubelet stand-in) on
``/var/lib/kubelet/device-plugins/kubelet.sock``, runs the containers of the pods
bound to this node as plain processes (the device plugin, from the code bound
into the node), restarts them with a back-off like the kubelet's
(CrashLoopBackOff), probes readiness over HTTP inside the node's network, and
reports to the control plane what the kubelet would: capacity/allocatable of
each extended resource and each pod's container state.

Protocol: the control plane writes one JSON line per change on stdin
(``{"pods": {name: container}}``, the full desired set); the agent writes a JSON
line on stdout whenever its report changes. End of stdin stops everything.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass

from gpunode.sim.kubelet import KubeletStandin
from gpunode.sim.workload import DeviceAdmissionError, Outcome, admit, launch

SOCKET_DIR = "/var/lib/kubelet/device-plugins"
UNMOUNTED_SOCKET_DIR = "/var/lib/gpunode-sim/not-mounted/device-plugins"  # never created
LOG_DIR = "/var/log/pods"
BACKOFF_START, BACKOFF_MAX = 2.0, 60.0  # the kubelet's are 10 s and 300 s; shorter so tests see a crash loop
# the simulated driver layer: the plugin's simulated backend reads the node's GPU state file
SIM_ENV = {"GPUNODE_PLUGIN_BACKEND": "sim"}


@dataclass
class Container:
    """One pod's container as the agent runs it."""

    pod: str
    spec: dict
    process: subprocess.Popen | None = None
    restarts: int = 0
    last_exit: int | None = None
    next_start: float = 0.0
    started_at: float = 0.0
    ready: bool = False
    log: str = ""

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gpunode_plugin", *self.spec.get("args", [])]
        mounted = any(m.get("mountPath") == SOCKET_DIR for m in self.spec.get("volumeMounts") or [])
        if not mounted:  # the container's view without the hostPath: no kubelet socket directory at all
            argv.append(f"--kubelet-socket={UNMOUNTED_SOCKET_DIR}/kubelet.sock")
        return argv

    def start(self) -> None:
        os.makedirs(LOG_DIR, exist_ok=True)
        self.log = f"{LOG_DIR}/{self.pod}.log"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **{e["name"]: str(e.get("value", ""))
                                                           for e in self.spec.get("env", [])}, **SIM_ENV}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started_at = time.monotonic()
        self.ready = False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def probe_url(self) -> str | None:
        probe = (self.spec.get("readinessProbe") or {}).get("httpGet")
        if not probe:
            return None
        port = probe.get("port")
        if isinstance(port, str):
            port = next((p["containerPort"] for p in self.spec.get("ports", []) if p.get("name") == port), None)
        return f"http://127.0.0.1:{port}{probe.get('path', '/')}" if port else None

    def tick(self) -> None:
        """Start, restart with back-off, or probe; as the kubelet's sync loop does for one container."""
        now = time.monotonic()
        if self.process is not None and self.process.poll() is not None:
            self.last_exit = self.process.returncode
            self.process = None
            self.ready = False
            self.restarts += 1
            lived = now - self.started_at
            delay = 0.0 if lived > BACKOFF_MAX else min(BACKOFF_MAX, BACKOFF_START * 2 ** min(self.restarts - 1, 10))
            self.next_start = now + delay
        if self.process is None:
            if now >= self.next_start:
                self.start()
            return
        url = self.probe_url()
        if url is None:
            self.ready = True
            return
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                self.ready = answer.status == 200
        except OSError:
            self.ready = False

    def state(self) -> dict:
        running = self.process is not None
        waiting = None
        if not running:
            waiting = "CrashLoopBackOff" if self.restarts else "ContainerCreating"
        tail = ""
        if self.log and os.path.exists(self.log):
            with open(self.log, "rb") as handle:
                handle.seek(max(0, os.path.getsize(self.log) - 2000))
                tail = handle.read().decode(errors="replace")
        return {"running": running, "ready": self.ready, "restarts": self.restarts, "waiting": waiting,
                "last_exit": self.last_exit, "log_tail": tail}


@dataclass
class Workload:
    """A workload pod: run once in its own thread (restartPolicy Never), its outcome reported."""

    pod: str
    spec: dict
    handler: str
    outcome: Outcome | None = None

    def start(self, kubelet: KubeletStandin, taken, admission: threading.Lock) -> None:
        def run() -> None:
            with admission:
                try:
                    env, devices = admit(kubelet, self.spec, taken())
                except DeviceAdmissionError as error:
                    self.outcome = Outcome("Failed", reason="UnexpectedAdmissionError", message=str(error))
                    return
                except Exception as error:  # noqa: BLE001 - Allocate failing is the pod's failure, reported
                    self.outcome = Outcome("Failed", reason="UnexpectedAdmissionError", message=repr(error))
                    return
                self.outcome = Outcome("Running", devices=devices)
            outcome = launch(self.pod, self.spec, env, self.handler)
            outcome.devices = devices
            self.outcome = outcome

        threading.Thread(target=run, daemon=True).start()

    def devices(self) -> set[str]:
        """Devices the pod holds: until it terminates (the kubelet frees a finished pod's devices)."""
        if self.outcome is None or self.outcome.phase != "Running":
            return set()
        return {d for ids in self.outcome.devices.values() for d in ids}

    def state(self) -> dict:
        if self.outcome is None:
            return {"workload": True, "phase": "Pending", "reason": "ContainerCreating"}
        o = self.outcome
        return {"workload": True, "phase": o.phase, "exit_code": o.exit_code, "reason": o.reason,
                "message": o.message, "log": o.log[-4000:], "devices": o.devices}


class Agent:
    """The node's kubelet loop: desired pods in from stdin, their states and the node's resources out on stdout.

    Reading stdin only files the newest desired set; the loop thread applies it,
    so no message waits on a container. Nothing that can block (plugin stops,
    readiness probes, Allocate) runs under the state lock.
    """

    def __init__(self) -> None:
        os.makedirs(SOCKET_DIR, exist_ok=True)
        self.kubelet = KubeletStandin(SOCKET_DIR)
        self.containers: dict[str, Container] = {}
        self.workloads: dict[str, Workload] = {}
        self.lock = threading.RLock()  # the two dicts above
        self.admission = threading.Lock()  # one pod's devices are picked and allocated at a time
        self.inbox: dict[str, dict] | None = None
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.last_report = ""

    def apply(self, entries: dict[str, dict]) -> None:
        pods = {name: e["container"] for name, e in entries.items() if e.get("role") == "plugin"}
        to_stop: list[Container] = []
        with self.lock:
            for name in [n for n in self.workloads if n not in entries]:
                del self.workloads[name]
            for name, entry in entries.items():
                if entry.get("role") == "workload" and name not in self.workloads:
                    workload = self.workloads[name] = Workload(name, entry["container"], entry.get("handler", ""))
                    workload.start(self.kubelet, self.taken, self.admission)
            for name in [n for n in self.containers if n not in pods]:
                to_stop.append(self.containers.pop(name))
            for name, spec in pods.items():
                current = self.containers.get(name)
                if current is not None and current.spec != spec:
                    to_stop.append(current)
                    current = None
                if current is None:
                    self.containers[name] = Container(name, spec)
        for container in to_stop:
            container.stop()

    def taken(self) -> set[str]:
        with self.lock:
            return {d for w in self.workloads.values() for d in w.devices()}

    def report(self) -> None:
        with self.lock:
            pods = {name: c.state() for name, c in self.containers.items()}
            pods.update({name: w.state() for name, w in self.workloads.items()})
        line = json.dumps({"resources": self.kubelet.report(), "pods": pods}, sort_keys=True)
        if line != self.last_report:
            self.last_report = line
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def loop(self) -> None:
        while not self.stopping.is_set():
            with self.lock:
                entries, self.inbox = self.inbox, None
            if entries is not None:
                self.apply(entries)
            with self.lock:
                containers = list(self.containers.values())
            for container in containers:
                container.tick()
            self.report()
            self.wake.wait(0.25)
            self.wake.clear()

    def run(self) -> None:
        self.kubelet.restart()  # a starting kubelet clears the sockets a previous one left
        worker = threading.Thread(target=self.loop, daemon=True)
        worker.start()
        for line in sys.stdin:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            with self.lock:
                self.inbox = message.get("pods", {})
            self.wake.set()
        self.stopping.set()
        self.wake.set()
        worker.join()
        for container in list(self.containers.values()):
            container.stop()
        self.kubelet.stop()


if __name__ == "__main__":
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)  # stacks into the agent's log
    Agent().run()
