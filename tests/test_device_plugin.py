"""The device plugin's real entry point against the kubelet stand-in, over real unix sockets."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import grpc
import pytest
from gpunode_sim.spec.profiles import load_profile

from .plugin_harness import PluginRun


@pytest.fixture
def plugin(tmp_path: Path):
    runs: list[PluginRun] = []

    def make(**kwargs: object) -> PluginRun:
        run = PluginRun(tmp_path / f"run{len(runs)}", **kwargs)  # type: ignore[arg-type]
        runs.append(run)
        return run

    yield make
    for run in runs:
        run.stop()


def test_registers_and_advertises_the_nodes_gpus(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered(), run.output()
    devices = run.kubelet.plugins["nvidia.com/gpu"].devices
    assert sorted(devices) == sorted(g["uuid"] for g in run.gpus)  # the same GPUs as the node's nvidia-smi
    assert set(devices.values()) == {"Healthy"}
    assert run.kubelet.plugins["nvidia.com/gpu"].endpoint == "gpunode-gpu.sock"
    assert run.kubelet.plugins["nvidia.com/gpu"].options.get_preferred_allocation_available
    assert run.wait_http("/readyz")[0] == 200
    assert run.http("/healthz") == (200, "ok\n")


def test_allocate_envvar_and_unknown_device(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    ids = [g["uuid"] for g in run.gpus]
    response = run.kubelet.allocate("nvidia.com/gpu", ids[:2], ids[3:])
    assert response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == ",".join(ids[:2])
    assert response.container_responses[1].envs["NVIDIA_VISIBLE_DEVICES"] == ids[3]
    assert not response.container_responses[0].devices
    with pytest.raises(grpc.RpcError) as error:
        run.kubelet.allocate("nvidia.com/gpu", ["GPU-not-here"])
    assert "invalid request: unknown device: GPU-not-here" in error.value.details()


@pytest.mark.parametrize(("strategy", "check"), [
    ("volume-mounts", lambda r, ids: r.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
     and [m.container_path for m in r.mounts] == [f"/var/run/nvidia-container-devices/{i}" for i in ids]
     and all(m.host_path == "/dev/null" for m in r.mounts)),
    ("cdi-annotations", lambda r, ids: "NVIDIA_VISIBLE_DEVICES" not in r.envs and list(r.annotations.values()) ==
     [",".join(f"nvidia.com/gpu={i}" for i in ids)]
     and list(r.annotations)[0].startswith("cdi.k8s.io/nvidia-device-plugin_")),
    # the kind the node's spec from 'nvidia-ctk cdi generate' defines (the plugin writes none of its own)
    ("cdi-cri", lambda r, ids: [d.name for d in r.cdi_devices] == [f"nvidia.com/gpu={i}" for i in ids]
     and not r.envs),
])
def test_allocate_strategies(plugin, strategy: str, check: object) -> None:
    run = plugin(args=("--device-list-strategy", strategy)).start()
    assert run.wait_registered()
    ids = [g["uuid"] for g in run.gpus][:2]
    response = run.kubelet.allocate("nvidia.com/gpu", ids).container_responses[0]
    assert check(response, ids), response  # type: ignore[operator]


def test_device_specs_name_real_device_nodes(plugin, tmp_path: Path) -> None:
    dev_root = tmp_path / "devroot"
    (dev_root / "dev").mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm"):
        (dev_root / "dev" / name).touch()
    run = plugin(args=("--pass-device-specs", "true", "--dev-root", str(dev_root))).start()
    assert run.wait_registered()
    gpu = run.gpus[2]
    response = run.kubelet.allocate("nvidia.com/gpu", [gpu["uuid"]]).container_responses[0]
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/nvidiactl", f"{dev_root}/dev/nvidiactl", "rw"), ("/dev/nvidia-uvm", f"{dev_root}/dev/nvidia-uvm", "rw"),
        (f"/dev/nvidia{gpu['minor']}", f"{dev_root}/dev/nvidia{gpu['minor']}", "rw")]


def test_preferred_allocation_prefers_nvlink_and_numa_and_never_fails(plugin) -> None:
    def topology(state: dict) -> None:
        uuids = [g["uuid"] for g in state["gpus"]]
        for gpu in state["gpus"]:
            gpu["numa_node"] = 0 if gpu["index"] < 4 else 1
        pairs = {0: 5, 5: 0, 2: 3, 3: 2}
        for index, peer in pairs.items():
            state["gpus"][index]["nvlink_peers"] = [uuids[peer]]

    run = plugin(profile="h100x8-nvswitch", gpu_edit=topology).start()
    assert run.wait_registered()
    ids = [g["uuid"] for g in run.gpus]
    assert run.kubelet.plugins["nvidia.com/gpu"].topology == {u: [0 if i < 4 else 1] for i, u in enumerate(ids)}
    assert sorted(run.kubelet.preferred("nvidia.com/gpu", ids, [], 2)) == sorted([ids[0], ids[5]]) or \
        sorted(run.kubelet.preferred("nvidia.com/gpu", ids, [], 2)) == sorted([ids[2], ids[3]])
    assert set(run.kubelet.preferred("nvidia.com/gpu", ids, [ids[3]], 2)) == {ids[2], ids[3]}
    four = run.kubelet.preferred("nvidia.com/gpu", ids[4:], [], 3)
    assert len(four) == 3 and set(four) <= set(ids[4:])
    # IDs the plugin does not know: still an answer (the first available), never an error
    assert run.kubelet.preferred("nvidia.com/gpu", ["x", "y", "z"], [], 2) == ["x", "y"]


def test_kubelet_restart_reregisters_quickly_and_only_our_files_go(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    foreign = run.socket_dir / "kubelet_internal_checkpoint"
    foreign.write_text("{}")
    latencies = []
    for _ in range(5):
        started = time.monotonic()
        run.kubelet.restart()
        assert run.wait_registered(timeout=5), run.output()
        latencies.append(time.monotonic() - started)
    assert max(latencies) < 1.0, latencies
    assert foreign.read_text() == "{}"
    assert run.stop_plugin() == 0
    assert sorted(os.listdir(run.socket_dir)) == ["kubelet.sock", "kubelet_internal_checkpoint"]
    assert stat.S_ISSOCK(os.lstat(run.socket_dir / "kubelet.sock").st_mode)


def count_threads_and_fds(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def test_one_hundred_kubelet_restarts_lose_nothing_and_leak_nothing(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    for _ in range(3):  # warm up gRPC's thread pools
        run.kubelet.restart()
        assert run.wait_registered(timeout=5)
    assert run.process is not None
    before = count_threads_and_fds(run.process.pid)
    for attempt in range(100):
        run.kubelet.restart()
        assert run.wait_registered(timeout=5), f"not registered after restart {attempt + 1}\n{run.output()[-2000:]}"
    deadline = time.monotonic() + 10  # threads of the last restarts may still be ending on a loaded machine
    after = count_threads_and_fds(run.process.pid)
    while not (after[0] <= before[0] + 2 and after[1] <= before[1] + 4) and time.monotonic() < deadline:
        time.sleep(0.2)
        after = count_threads_and_fds(run.process.pid)
    assert after[0] <= before[0] + 2 and after[1] <= before[1] + 4, (before, after)
    assert sorted(run.kubelet.plugins["nvidia.com/gpu"].devices) == sorted(g["uuid"] for g in run.gpus)
    status, metrics = run.http("/metrics")
    assert 'gpunode_plugin_reregistrations_total{resource="nvidia.com/gpu"} 103' in metrics


def test_lost_listandwatch_stream_reregisters(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    first = len(run.kubelet.registrations)
    run.kubelet.plugins["nvidia.com/gpu"].channel.close()  # the kubelet drops the stream, the socket stays
    assert run.kubelet.wait_for(lambda k: len(k.registrations) > first and k.allocatable("nvidia.com/gpu") == 4,
                                5), run.output()


def test_xid_marks_the_gpu_unhealthy_at_once_ignored_xids_do_not(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    ids = [g["uuid"] for g in run.gpus]
    for xid in (13, 31, 43, 45, 68, 109):
        run.inject(f"{ids[0]} {xid}")
    run.inject(f"{ids[1]} 79")
    started = time.monotonic()
    assert run.kubelet.wait_for(lambda k: k.plugins["nvidia.com/gpu"].devices[ids[1]] == "Unhealthy", 2)
    assert time.monotonic() - started < 1.0
    assert run.kubelet.allocatable("nvidia.com/gpu") == 3 and run.kubelet.capacity("nvidia.com/gpu") == 4
    assert run.kubelet.plugins["nvidia.com/gpu"].devices[ids[0]] == "Healthy"
    assert f'gpunode_plugin_last_xid{{gpu="{ids[1]}"}} 79' in run.http("/metrics")[1]
    run.inject(f"{ids[2]} ecc")
    assert run.wait_registered(count=2, timeout=3)


def test_health_switches_and_failed_wait(plugin) -> None:
    run = plugin(env={"DP_DISABLE_HEALTHCHECKS": "79", "DP_ENABLE_HEALTHCHECKS": "13"}).start()
    assert run.wait_registered()
    ids = [g["uuid"] for g in run.gpus]
    run.inject(f"{ids[0]} 79")  # now ignored
    run.inject(f"{ids[1]} 13")  # re-enabled
    assert run.wait_registered(count=3, timeout=3)
    assert run.kubelet.plugins["nvidia.com/gpu"].devices[ids[0]] == "Healthy"
    run.inject("all error nvmlEventSetWait: Unknown Error")
    assert run.wait_registered(count=0, timeout=3)


def test_recovery_after_a_quiet_period_is_opt_in(plugin) -> None:
    run = plugin(args=("--health-recovery-seconds", "1")).start()
    assert run.wait_registered()
    run.inject(f"{run.gpus[0]['uuid']} 48")
    assert run.wait_registered(count=3, timeout=3)
    assert run.wait_registered(count=4, timeout=5), run.output()


def test_time_slicing_config_in_nvidias_format(plugin, tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  migStrategy: none\nsharing:\n  timeSlicing:\n"
                      "    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n"
                      "    - name: nvidia.com/gpu\n      replicas: 4\n")
    run = plugin(profile="v100x2-docker", args=("--config-file", str(config))).start()
    assert run.wait_registered("nvidia.com/gpu.shared", count=8), run.output()
    ids = sorted(run.kubelet.plugins["nvidia.com/gpu.shared"].devices)
    assert ids[0].endswith("::0") and len({i.split("::")[0] for i in ids}) == 2
    response = run.kubelet.allocate("nvidia.com/gpu.shared", [ids[0]]).container_responses[0]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == ids[0].split("::")[0]
    with pytest.raises(grpc.RpcError) as error:
        run.kubelet.allocate("nvidia.com/gpu.shared", ids[:2])
    assert "maximum request size for shared resources is 1" in error.value.details()
    spread = run.kubelet.preferred("nvidia.com/gpu.shared", ids, [], 2)
    assert len({i.split("::")[0] for i in spread}) == 2  # distributed: one replica from each GPU


def mig_profile() -> dict:
    profile = load_profile("a100x4-containerd")
    return dict(profile, gpu={**profile["gpu"], "mig": True})


def with_mig(layout: dict[int, list[str]]):
    def edit(state: dict) -> None:
        for gpu in state["gpus"]:
            profiles = layout.get(gpu["index"])
            if profiles is None:
                gpu["mig_mode"] = "Disabled"
                continue
            gpu["mig_mode"] = "Enabled"
            gpu["mig_devices"] = [{"uuid": f"MIG-{gpu['index']}-{n}-{p}", "profile": p, "index": f"{gpu['index']}:{n}",
                                   "gpu_instance": n + 1, "compute_instance": 0} for n, p in enumerate(profiles)]
    return edit


def test_mig_mixed_exposes_each_profile(plugin) -> None:
    layout = {0: ["3g.20gb", "3g.20gb"], 1: ["1g.5gb"] * 7}
    run = plugin(profile=mig_profile(), gpu_edit=with_mig(layout), args=("--mig-strategy", "mixed")).start()
    assert run.wait_registered("nvidia.com/mig-1g.5gb", count=7), run.output()
    assert run.wait_registered("nvidia.com/mig-3g.20gb", count=2)
    assert run.wait_registered("nvidia.com/gpu", count=2)  # GPUs 2 and 3 are not MIG-enabled
    run.inject("GPU-does-not-matter 0")  # event for an unknown GPU: everything unhealthy, like NVIDIA's
    assert run.wait_registered("nvidia.com/mig-1g.5gb", count=0, timeout=3)


def test_mig_single_refuses_mixed_profiles(plugin) -> None:
    layout = {0: ["3g.20gb"], 1: ["1g.5gb"], 2: ["1g.5gb"], 3: ["1g.5gb"]}
    run = plugin(profile=mig_profile(), gpu_edit=with_mig(layout), args=("--mig-strategy", "single")).start()
    assert run.process is not None and run.process.wait(15) == 1
    assert "more than one MIG device type present on node" in run.output()


def test_mig_single_exposes_mig_devices_as_gpus_and_marks_all_of_a_failing_gpu(plugin) -> None:
    layout = {i: ["2g.10gb"] * 3 for i in range(4)}
    run = plugin(profile=mig_profile(), gpu_edit=with_mig(layout), args=("--mig-strategy", "single")).start()
    assert run.wait_registered("nvidia.com/gpu", count=12), run.output()
    run.inject(f"{run.gpus[0]['uuid']} 79")
    assert run.wait_registered("nvidia.com/gpu", count=9, timeout=3)  # all three MIG devices of GPU 0


@pytest.mark.parametrize(("faults", "hint"), [
    (["driver-not-loaded"], "load the NVIDIA kernel module"),
    (["library-mismatch"], "upgraded without a reboot"),
])
def test_nvml_init_failure_exits_with_the_hint(plugin, faults: list[str], hint: str) -> None:
    profile = dict(load_profile("a100x4-containerd"), faults=faults)
    run = plugin(profile=profile).start()
    assert run.process is not None and run.process.wait(15) == 1
    assert hint in run.output()


def test_nvml_init_failure_idles_without_crash_looping_when_asked(plugin) -> None:
    profile = dict(load_profile("a100x4-containerd"), faults=["driver-not-loaded"])
    run = plugin(profile=profile, env={"FAIL_ON_INIT_ERROR": "false"}).start()
    status, text = run.wait_http("/healthz")
    assert status == 200 and "idle: NVML: Driver Not Loaded" in text
    assert run.http("/readyz")[0] == 503
    assert run.process is not None and run.process.poll() is None
    assert run.kubelet.plugins == {}


def test_cpu_only_node(plugin) -> None:
    run = plugin(profile="cpu-only").start()
    assert run.process is not None and run.process.wait(15) == 1
    assert "nodeSelector" in run.output()


@pytest.mark.parametrize(("text", "message"), [
    ("version: v2\n", "version must be 'v1'"),
    ("version: v1\nflags:\n  migStrateg: mixed\n", "unknown key 'flags.migStrateg'"),
    ("version: v1\nflags:\n  migStrategy: half\n", "migStrategy: 'half' is not one of none, single, mixed"),
    ("version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
     "sharing.timeSlicing.resources[0].replicas must be a whole number >= 2"),
    ("version: v1\nflags:\n  plugin:\n    deviceListStrategy: [envvar, magic]\n",
     "deviceListStrategy: 'magic' is not one of"),
    ("version: [v1\n", "is not valid YAML/JSON"),
])
def test_bad_config_file_names_the_key(plugin, tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    run = plugin(args=("--config-file", str(config))).start()
    assert run.process is not None and run.process.wait(15) == 2
    assert message in run.output() and "Traceback" not in run.output()


def test_socket_directory_not_writable(plugin) -> None:
    run = plugin()
    # root may write anywhere, so the directory is made read-only for the plugin's own mount namespace
    wrapper = ("unshare", "--mount", "sh", "-c",
               f'mount --bind -o ro "{run.socket_dir}" "{run.socket_dir}" && exec "$0" "$@"')
    run.start(kubelet=False, wrapper=wrapper)
    assert run.process is not None and run.process.wait(15) == 1
    assert f"the device-plugin socket directory {run.socket_dir} is not writable" in run.output()
    assert "Traceback" not in run.output()


def test_socket_path_too_long(plugin, tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    run = plugin(args=("--kubelet-socket", str(deep / "kubelet.sock")))
    run.start(kubelet=False)
    assert run.process is not None and run.process.wait(15) == 1
    assert "unix sockets allow 107: use a shorter socket directory" in run.output()


def test_help_has_examples_and_the_version_runs() -> None:
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "gpunode_plugin", "--help"], capture_output=True, text=True,
                           check=False)
    assert shown.returncode == 0 and "examples:" in shown.stdout and "--mig-strategy" in shown.stdout
    version = subprocess.run([sys.executable, "-m", "gpunode_plugin", "--version"], capture_output=True, text=True,
                             check=False)
    assert version.stdout.startswith("gpunode-device-plugin ")


def test_kubelet_refuses_bad_registrations(tmp_path: Path) -> None:
    from gpunode_plugin.api import pb, rpc
    from gpunode_sim.guest.device_manager import KubeletStandin

    kubelet = KubeletStandin(str(tmp_path / "dp"))
    kubelet.start()
    try:
        with grpc.insecure_channel(f"unix://{kubelet.socket_path}") as channel:
            stub = rpc.RegistrationStub(channel)
            for request, message in (
                (pb.RegisterRequest(version="v1alpha", endpoint="x.sock", resource_name="nvidia.com/gpu"),
                 'requested API version "v1alpha" is not supported by kubelet'),
                (pb.RegisterRequest(version="v1beta1", endpoint="x.sock", resource_name="kubernetes.io/gpu"),
                 'the ResourceName "kubernetes.io/gpu" is invalid'),
                (pb.RegisterRequest(version="v1beta1", endpoint="missing.sock", resource_name="nvidia.com/gpu"),
                 "failed to dial device plugin"),
            ):
                with pytest.raises(grpc.RpcError) as error:
                    stub.Register(request, timeout=20)
                assert message in error.value.details()
    finally:
        kubelet.stop()


def test_sigterm_removes_our_socket_only(plugin) -> None:
    run = plugin().start()
    assert run.wait_registered()
    assert (run.socket_dir / "gpunode-gpu.sock").exists()
    assert run.stop() == 0
    assert not (run.socket_dir / "gpunode-gpu.sock").exists()
    assert '"stopped; removed our sockets"' in run.output() or "stopped; removed our sockets" in run.output()


def test_this_session_is_not_gevent_patched() -> None:
    """pyinfra_cli patches the process with gevent on import; the gRPC tests here must not run patched."""
    import sys

    monkey = sys.modules.get("gevent.monkey")
    assert monkey is None or not monkey.is_module_patched("threading")
