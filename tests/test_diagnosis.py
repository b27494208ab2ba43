"""Diagnoses: each broken state gives the finding an SRE needs (what, evidence, fix), healthy ones none."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from gpunode import gpu_generations
from gpunode.diagnosis import Verdict, failures
from gpunode.diagnosis import driver as driver_diagnosis
from gpunode.diagnosis import runtime as runtime_diagnosis
from gpunode.diagnosis import toolkit as toolkit_diagnosis
from gpunode.diagnosis import toolkit_repo as repo_diagnosis
from gpunode.settings import NodeSettings

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia-ctk"

A100 = {
    "nvidia_smi": {"rc": 0, "output": ["..."], "gpus": [
        {"index": i, "name": "NVIDIA A100-SXM4-40GB", "uuid": f"GPU-{i}", "memory_mib": 40960,
         "driver_version": "550.54.15", "pci_bus_id": f"00000000:0{i}:00.0", "compute_cap": "8.0",
         "mig_mode": "Disabled"} for i in range(2)]},
    "module_version": "550.54.15", "proc_version": "NVRM version: ...",
    "devices": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia1"],
    "modules": ["nvidia_uvm", "nvidia"], "nvswitch_count": 0,
    "fabricmanager": {"active": "inactive", "version": None}, "fabric": [],
}


def driver_state(**changes: object) -> dict:
    state = copy.deepcopy(A100)
    for key, value in changes.items():
        if key == "smi":
            state["nvidia_smi"].update(value)  # type: ignore[arg-type]
        elif key == "gpu":
            for gpu in state["nvidia_smi"]["gpus"]:
                gpu.update(value)  # type: ignore[arg-type]
        else:
            state[key] = value
    return state


DRIVER_CASES = [
    ("healthy", {}, {}, []),
    ("driver not loaded", {"smi": {"rc": 9, "output": [
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure ..."], "gpus": []},
        "module_version": None, "devices": [], "modules": []}, {}, ["kernel module is not loaded"]),
    ("mismatch after upgrade", {"smi": {"rc": 18, "output": [
        "Failed to initialize NVML: Driver/library version mismatch"], "gpus": []}}, {},
     ["driver upgraded without reboot"]),
    ("module older than user space", {"module_version": "535.183.01"}, {}, ["driver upgraded without reboot"]),
    ("below configured minimum", {"gpu": {"driver_version": "530.30.02"}, "module_version": "530.30.02"}, {},
     ["older than the configured minimum 535"]),
    ("hopper needs 520.61.05", {"gpu": {"driver_version": "515.76", "name": "NVIDIA H100 80GB HBM3",
                                        "compute_cap": "9.0"}, "module_version": "515.76"},
     {"driver_min_version": "510"}, ["too old for NVIDIA H100 80GB HBM3 (hopper: needs >= 520.61.05)"]),
    ("device node missing", {"devices": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]}, {},
     ["device nodes missing: /dev/nvidia1"]),
    # nvidia-smi works without nvidia_uvm; CUDA does not
    ("uvm not loaded", {"devices": ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"], "modules": ["nvidia"]}, {},
     ["nvidia_uvm is not loaded or /dev/nvidia-uvm is missing"]),
    ("uvm device node gone", {"devices": ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1"]}, {},
     ["nvidia_uvm is not loaded or /dev/nvidia-uvm is missing"]),
    # a non-root container cannot open them: NVML's "Insufficient Permissions"
    ("nvidiactl 0600", {"device_modes": {"/dev/nvidiactl": "600", "/dev/nvidia0": "666"}}, {},
     ["GPU device node(s) not open to every user: /dev/nvidiactl"]),
    ("device nodes 0660 for group video", {"device_modes": {"/dev/nvidiactl": "660", "/dev/nvidia0": "660"}}, {},
     ["not open to every user: /dev/nvidia0, /dev/nvidiactl"]),
    # NVIDIA's documented --query-gpu and --query-remapped-rows fields (their CSV is not in shared/reference)
    ("uncorrectable ECC, remap pending", {"health": [{"index": 1, "ecc_uncorrected": 2, "retired_pending": None,
                                                     "compute_mode": "Default"}],
                                          "remapped_rows": {"GPU-1": {"pending": "Yes", "failure": "No"}}}, {},
     ["GPU 1 (GPU-1): uncorrectable memory errors, repair pending until a GPU reset"]),
    ("page pending retirement", {"health": [{"index": 0, "ecc_uncorrected": 0, "retired_pending": "Yes",
                                             "compute_mode": "Default"}]}, {}, ["repair pending until a GPU reset"]),
    ("row remap failed", {"health": [{"index": 0, "ecc_uncorrected": 0, "retired_pending": None,
                                      "compute_mode": "Default"}],
                          "remapped_rows": {"GPU-0": {"pending": "No", "failure": "Yes"}}}, {},
     ["a row remap failed"]),
    # NVIDIA's documented reset_status fields (--help-query-gpu; their CSV is not in shared/reference)
    ("gpu requires reset", {"reset_status": [{"index": 1, "reset_required": "Yes",
                                              "drain_and_reset_recommended": "No"}]}, {},
     ["GPU 1 (GPU-1) requires a reset"]),
    ("drain and reset recommended", {"reset_status": [{"index": 0, "reset_required": "No",
                                                       "drain_and_reset_recommended": "Yes"}]}, {},
     ["GPU 0 (GPU-0): the driver recommends a drain and reset"]),
    ("no reset asked", {"reset_status": [{"index": 0, "reset_required": "No",
                                          "drain_and_reset_recommended": "No"}]}, {}, []),
    ("compute prohibited", {"health": [{"index": 0, "ecc_uncorrected": 0, "retired_pending": "No",
                                        "compute_mode": "Prohibited"}]}, {}, ["compute mode Prohibited"]),
    ("healthy memory, exclusive process", {"health": [{"index": 0, "ecc_uncorrected": 0, "retired_pending": "No",
                                                       "compute_mode": "Exclusive_Process"}],
                                           "remapped_rows": {"GPU-0": {"pending": "No", "failure": "No"}}}, {}, []),
    # nvidia-smi -L lists no MIG device under a GPU whose MIG mode is on (the format in shared/reference)
    ("mig on without instances", {"smi": {"gpus": [dict(A100["nvidia_smi"]["gpus"][0], mig_mode="Enabled",
                                                          mig_devices=[]), A100["nvidia_smi"]["gpus"][1]]}}, {},
     ["MIG mode is on but no MIG device exists on GPU(s) 0"]),
    ("mig on with instances", {"smi": {"gpus": [dict(A100["nvidia_smi"]["gpus"][0], mig_mode="Enabled",
                                                      mig_devices=["1g.5gb"]), A100["nvidia_smi"]["gpus"][1]]}}, {},
     []),
    # the capability nodes a MIG device is handed with (NVIDIA's toolkit: internal/nvcaps; None: not read)
    ("mig devices without caps nodes", {"smi": {"gpus": [dict(A100["nvidia_smi"]["gpus"][0], mig_mode="Enabled",
                                                               mig_devices=["1g.5gb", "1g.5gb"]),
                                                          A100["nvidia_smi"]["gpus"][1]]}, "mig_caps": []}, {},
     ["2 MIG device(s) exist but /dev/nvidia-caps has no capability device node"]),
    ("mig devices with caps nodes", {"smi": {"gpus": [dict(A100["nvidia_smi"]["gpus"][0], mig_mode="Enabled",
                                                            mig_devices=["1g.5gb"]), A100["nvidia_smi"]["gpus"][1]]},
                                     "mig_caps": ["/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap12"]},
     {}, []),
    ("caps not read (older facts)", {"smi": {"gpus": [dict(A100["nvidia_smi"]["gpus"][0], mig_mode="Enabled",
                                                            mig_devices=["1g.5gb"]), A100["nvidia_smi"]["gpus"][1]]},
                                     "mig_caps": None}, {}, []),
    # a warning: the link holds (failures() leaves it out), the finding is there with its evidence
    ("persistence mode off", {"health": [{"index": 1, "ecc_uncorrected": 0, "retired_pending": "No",
                                          "compute_mode": "Default", "persistence_mode": "Disabled"}]}, {}, []),
    ("modes as the driver makes them", {"device_modes": {"/dev/nvidiactl": "666", "/dev/nvidia0": "666"}}, {}, []),
    ("nouveau bound", {"smi": {"rc": 9, "output": ["NVIDIA-SMI has failed ..."], "gpus": []},
                       "module_version": None, "modules": ["nouveau"]}, {}, ["nouveau is bound"]),
    ("gpu lost", {"smi": {"rc": 15, "output": ["Unable to determine the device handle for GPU0000:07:00.0: GPU is "
                                               "lost.  Reboot the system to recover this GPU"], "gpus": []}}, {},
     ["fallen off the bus"]),
    ("no devices", {"smi": {"rc": 6, "output": ["No devices were found"], "gpus": []}}, {}, ["no GPU initialised"]),
    ("nvswitch without fabric manager", {"nvswitch_count": 4, "fabric": ["In Progress, N/A"]}, {},
     ["without a running nvidia-fabricmanager"]),
    ("fabric manager at another version", {"nvswitch_count": 4, "fabric": ["Completed, Success"],
                                           "fabricmanager": {"active": "active", "version": "550.54.14"}}, {},
     ["nvidia-fabricmanager 550.54.14 does not match driver 550.54.15"]),
    ("fabric in progress", {"nvswitch_count": 4, "fabric": ["In Progress, N/A"],
                            "fabricmanager": {"active": "active", "version": "550.54.15"}}, {},
     ["fabric is not initialised"]),
    ("healthy nvswitch", {"nvswitch_count": 4, "fabric": ["Completed, Success"],
                          "fabricmanager": {"active": "active", "version": "550.54.15"}}, {}, []),
    ("cpu-only but gpus required", {"smi": {"rc": 127, "output": [], "gpus": []}, "module_version": None,
                                    "devices": [], "modules": []}, {"gpu_required": True}, ["no NVIDIA driver"]),
]


@pytest.mark.parametrize(("changes", "settings", "expected"), [c[1:] for c in DRIVER_CASES],
                         ids=[c[0] for c in DRIVER_CASES])
def test_driver_diagnosis(changes: dict, settings: dict, expected: list[str]) -> None:
    findings = failures(driver_diagnosis.diagnose(driver_state(**changes), NodeSettings(**settings)))
    assert [f.what for f in findings if any(e in f.what for e in expected)] == [f.what for f in findings]
    assert len(findings) == len(expected)
    for finding in findings:
        assert finding.evidence and finding.fix


def test_cpu_only_host_is_skipped_not_failed() -> None:
    state = driver_state(smi={"rc": 127, "output": [], "gpus": []}, module_version=None, devices=[], modules=[])
    findings = driver_diagnosis.diagnose(state, NodeSettings())
    assert [f.state for f in findings] == [Verdict.NOT_CHECKED]


@pytest.mark.parametrize(("name", "cap", "family"), [
    ("NVIDIA A100-SXM4-40GB", "8.0", "ampere"), ("NVIDIA H100 80GB HBM3", None, "hopper"),
    ("Tesla V100-SXM2-32GB", None, "volta"), ("NVIDIA L4", None, "ada"), ("NVIDIA L40S", "8.9", "ada"),
    ("NVIDIA A10", None, "ampere"), ("NVIDIA B200", "10.0", "blackwell"), ("Tesla T4", "7.5", "turing"),
])
def test_gpu_family(name: str, cap: str | None, family: str) -> None:
    assert gpu_generations.gpu_family(name, cap) == family


GOOD_LIST = ["deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
             "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"]


@pytest.mark.parametrize(("state", "expected"), [
    ({"keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"], "list": GOOD_LIST, "stale_lists": []}, []),
    ({"keyring_fingerprints": [], "list": GOOD_LIST, "stale_lists": []}, ["keyring"]),
    ({"keyring_fingerprints": ["0" * 40], "list": GOOD_LIST, "stale_lists": []}, ["other than the pinned one"]),
    ({"keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"], "list": None, "stale_lists": []},
     ["is missing"]),
    ({"keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"],
      "list": ["deb https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH) /"], "stale_lists": []},
     ["not the pinned line"]),
    ({"keyring_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"], "list": GOOD_LIST,
      "stale_lists": ["/etc/apt/sources.list.d/nvidia-docker.list"]}, ["Conflicting values set for option Signed-By"]),
])
def test_toolkit_repo_diagnosis(state: dict, expected: list[str]) -> None:
    findings = repo_diagnosis.diagnose({"family": "deb", **state}, NodeSettings())
    failed = failures(findings)
    assert len(failed) == len(expected)
    for finding, text in zip(failed, expected, strict=True):
        assert text in finding.what
    if not expected:  # the proof quotes the key and the line as read
        assert findings[-1].state is Verdict.OK
        assert any(state["keyring_fingerprints"][0] in line for line in findings[-1].evidence)
        assert any(GOOD_LIST[0] in line for line in findings[-1].evidence)


PACKAGES = ("nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
            "libnvidia-container1")


@pytest.mark.parametrize(("versions", "held", "hold", "expected"), [
    ({p: "1.17.8-1" for p in PACKAGES}, list(PACKAGES), True, []),
    ({p: None for p in PACKAGES}, [], True, ["is not installed"]),
    ({**{p: "1.17.8-1" for p in PACKAGES}, "libnvidia-container1": "1.20.0-1"}, [], True,
     ["not all at the pinned 1.17.8-1"]),
    ({p: "1.17.8-1" for p in PACKAGES}, ["nvidia-container-toolkit"], True, ["not held"]),
    ({p: "1.17.8-1" for p in PACKAGES}, [], False, []),
])
def test_toolkit_diagnosis(versions: dict, held: list, hold: bool, expected: list[str]) -> None:
    findings = toolkit_diagnosis.diagnose({"family": "deb", "versions": versions, "held": held, "locks": {}},
                                          NodeSettings(toolkit_hold=hold))
    failed = failures(findings)
    assert [e for e, f in zip(expected, failed, strict=True) if e in f.what] == expected
    if not expected:
        assert findings[-1].state is Verdict.OK
        assert findings[-1].evidence[:4] == [
            f"dpkg-query: {name} {versions[name]} ({'' if name in held else 'not '}held)" for name in sorted(versions)]


def containerd_state(main: str | None, dump: str, active: str = "active") -> dict:
    return {"installed": ["containerd"], "active": {"containerd": active}, "containerd_config": main,
            "containerd_dropins": {}, "containerd_dump": {"rc": 0, "text": dump}, "containerd_default": None,
            "docker_config": None}


def fixture(version: str, case: str, name: str = "config.toml") -> str:
    path = FIXTURES / version / case / "files" / name
    return path.read_text()


@pytest.mark.parametrize(("case", "settings", "codes"), [
    ("v1.17.8/ctrd-containerd-1.6.20-default", {}, set()),
    ("v1.17.8/ctrd-containerd-1.7.24-default-setdefault", {}, {"default-runtime-wrong"}),
    ("v1.17.8/ctrd-containerd-1.7.24-default-setdefault", {"nvidia_runtime_default": True}, set()),
    ("v1.17.8/ctrd-custom-v2-systemd-cdi", {"cdi_enabled": True}, set()),
    ("v1.17.8/ctrd-custom-v2-systemd", {"cdi_enabled": True}, {"cdi-missing"}),
    ("v1.17.8/ctrd-containerd-2.1.9-default", {}, set()),
    ("v1.17.8/ctrd-debian-packaged-config", {}, {"base-config-missing"}),
    ("v1.20.0/ctrd-containerd-1.7.24-default-nodropin", {}, {"nvidia-runtime-missing"}),
])
def test_runtime_diagnosis_reads_the_effective_containerd_config(case: str, settings: dict, codes: set) -> None:
    version, name = case.split("/")
    text = fixture(version, name)
    findings = runtime_diagnosis.diagnose(containerd_state(text, text), NodeSettings(**settings))
    assert {f.code for f in failures(findings)} == codes
    assert (findings[-1].code == "ok") == (not codes)


def test_runtime_dropin_layout_reads_as_configured() -> None:
    main = fixture("v1.20.0", "ctrd-custom-v2-systemd")
    dropin = fixture("v1.20.0", "ctrd-custom-v2-systemd", "etc/containerd/conf.d/99-nvidia.toml")
    # containerd merges the drop-in's CRI table over the main config: the drop-in is a full snapshot of it
    findings = runtime_diagnosis.diagnose(containerd_state(main, dropin), NodeSettings())
    assert [f.code for f in findings] == ["ok"]
    main_only = runtime_diagnosis.diagnose(containerd_state(main, main), NodeSettings())
    assert {f.code for f in main_only} == {"nvidia-runtime-missing"}


def test_invalid_toml_is_refused_with_its_location() -> None:
    findings = runtime_diagnosis.diagnose(containerd_state("version = 2\n[plugins\n", ""), NodeSettings())
    assert [f.code for f in findings] == ["config-invalid"]
    assert "line 2" in findings[0].evidence[0]


SCHEMA1_WITH_NVIDIA = """[plugins.cri.containerd]
  default_runtime_name = "runc"
[plugins.cri.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.cri.containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
[plugins.cri.containerd.runtimes.nvidia.options]
  BinaryName = "/usr/bin/nvidia-container-runtime"
"""


def test_a_versionless_schema_1_config_is_read_with_the_cri_plugin_name() -> None:
    findings = runtime_diagnosis.diagnose(containerd_state(SCHEMA1_WITH_NVIDIA, SCHEMA1_WITH_NVIDIA), NodeSettings())
    assert [f.code for f in findings] == ["ok"]
    assert "containerd config dump: plugins.'cri'.containerd.runtimes = runc, nvidia" in findings[0].evidence
    without = SCHEMA1_WITH_NVIDIA.split("[plugins.cri.containerd.runtimes.nvidia]")[0]
    assert {f.code for f in runtime_diagnosis.diagnose(containerd_state(without, without), NodeSettings())} == {
        "nvidia-runtime-missing"}


def test_a_dump_that_is_not_toml_is_a_finding_not_a_crash() -> None:
    state = containerd_state(SCHEMA1_WITH_NVIDIA, "WARN[0000] something\nversion = 2\n")
    findings = runtime_diagnosis.diagnose(state, NodeSettings())
    assert [f.code for f in findings] == ["dump-unreadable"]
    assert findings[0].evidence[1] == "containerd config dump: WARN[0000] something"


def test_a_rejected_config_quotes_what_containerd_said_on_stderr() -> None:
    state = containerd_state(SCHEMA1_WITH_NVIDIA, "")
    state["containerd_dump"] = {"rc": 1, "text": "", "stderr": "containerd: failed to load TOML: bad key"}
    findings = runtime_diagnosis.diagnose(state, NodeSettings())
    assert [f.code for f in findings] == ["config-rejected"]
    assert findings[0].evidence == ["containerd config dump: containerd: failed to load TOML: bad key"]


def test_stopped_runtime() -> None:
    text = fixture("v1.17.8", "ctrd-containerd-1.6.20-default")
    findings = runtime_diagnosis.diagnose(containerd_state(text, text, active="inactive"), NodeSettings())
    assert [f.code for f in findings] == ["runtime-down"]
    assert "systemctl is-active containerd: inactive" in findings[0].evidence


@pytest.mark.parametrize(("text", "settings", "codes"), [
    (None, {}, {"nvidia-runtime-missing"}),
    ("", {}, {"nvidia-runtime-missing"}),
    ('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}', {}, set()),
    ('{"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}', {},
     {"default-runtime-wrong"}),
    ('{"runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}', {"cdi_enabled": True}, {"cdi-missing"}),
    ('{"runtimes": ', {}, {"config-invalid"}),
])
def test_docker_diagnosis(text: str | None, settings: dict, codes: set) -> None:
    state = {"installed": ["containerd", "docker", "docker-cli"],
             "active": {"docker": "active", "containerd": "active"}, "containerd_config": None,
             "containerd_dropins": {}, "containerd_dump": None, "containerd_default": None, "docker_config": text}
    assert {f.code for f in failures(runtime_diagnosis.diagnose(state, NodeSettings(**settings)))} == codes


@pytest.mark.parametrize(("data", "message"), [
    ({"toolkit_version": "1.17.8"}, "toolkit_version = '1.17.8' is not accepted: expected a full package version"),
    ({"toolkit_key_fingerprint": "c95b 321b"}, "expected a 40-hex-digit fingerprint"),
    ({"container_runtime": "podman"}, "container_runtime = 'podman' is not accepted: expected one of auto, "
                                      "containerd, docker"),
    ({"nvidia_runtime_default": "maybe"}, "nvidia_runtime_default = 'maybe' is not accepted: expected true or false"),
    ({"driver_min_version": "latest"}, "expected a driver version like 535"),
    ({"toolkit_repository_url": "nvidia.github.io"}, "expected an http://, https:// or file:// URL"),
    ({"runtime_restart_timeout": "soon"}, "runtime_restart_timeout = 'soon' is not accepted: expected a whole number"),
    ({"runtime_restart_timeout": 2}, "expected at least 5"),
])
def test_bad_inventory_data_names_the_key(data: dict, message: str) -> None:
    from gpunode.errors import GpunodeError

    with pytest.raises(GpunodeError, match=message):
        NodeSettings.from_data(data)


# -- what the runtime step finds behind "no nvidia runtime", and where it read it ---------------------------------

CRI_DISABLED_DUMP = 'disabled_plugins = ["io.containerd.grpc.v1.cri"]\nversion = 2\n[plugins]\n'


def test_a_disabled_cri_plugin_is_named_with_the_file_that_disables_it() -> None:
    # seen on a simulated node with containerd 1.6.20: the dump then has no CRI table at all (no runtimes)
    main = fixture("v1.17.8", "ctrd-containerd-1.6.20-default").replace(
        "disabled_plugins = []", 'disabled_plugins = ["io.containerd.grpc.v1.cri"]')
    findings = runtime_diagnosis.diagnose(containerd_state(main, CRI_DISABLED_DUMP), NodeSettings())
    assert [f.code for f in findings] == ["cri-disabled"]
    assert "/etc/containerd/config.toml: disabled_plugins lists 'io.containerd.grpc.v1.cri'" in findings[0].evidence
    assert "remove 'io.containerd.grpc.v1.cri' from disabled_plugins in /etc/containerd/config.toml" in findings[0].fix


@pytest.mark.parametrize(("status", "code"), [("absent", "cri-plugin-missing"), ("error", "cri-plugin-failed"),
                                              ("unanswered (ctr plugins ls exit 124)", "runtime-unanswered")])
def test_what_ctr_says_of_the_cri_plugin(status: str, code: str) -> None:
    text = fixture("v1.17.8", "ctrd-containerd-1.6.20-default")
    state = {**containerd_state(text, text), "cri_status": status}
    findings = failures(runtime_diagnosis.diagnose(state, NodeSettings()))
    assert [f.code for f in findings] == [code]
    assert any(line.startswith("ctr plugins ls: ") for line in findings[0].evidence)


def test_an_nvidia_runtime_with_other_options_than_runc_is_named_with_both_values() -> None:
    text = fixture("v1.17.8", "ctrd-custom-v2-systemd")  # nvidia-ctk copied runc's SystemdCgroup = true
    dump = text.replace("SystemdCgroup = true", "SystemdCgroup = false", 1)  # then someone changed nvidia's
    assert dump != text
    findings = failures(runtime_diagnosis.diagnose(containerd_state(dump, dump), NodeSettings()))
    assert [f.code for f in findings] == ["nvidia-options-differ"]
    assert ("containerd config dump: options.SystemdCgroup: runc True, nvidia False (set in "
            "/etc/containerd/config.toml)") in findings[0].evidence


def test_an_nvidia_runtime_under_the_wrong_table_is_explained() -> None:
    # a version 2 file whose nvidia runtime sits under the schema-1 name: containerd never reads it
    base = fixture("v1.20.0", "ctrd-custom-v2-systemd")  # the drop-in layout's main config: no nvidia runtime
    main = base + '\n[plugins.cri.containerd.runtimes.nvidia]\n  runtime_type = "io.containerd.runc.v2"\n'
    findings = failures(runtime_diagnosis.diagnose(containerd_state(main, base), NodeSettings()))
    assert [f.code for f in findings] == ["nvidia-runtime-missing"]
    assert ("/etc/containerd/config.toml: defines the nvidia runtime under plugins.'cri', but a version 2 config "
            "is read from plugins.'io.containerd.grpc.v1.cri'") in findings[0].evidence


def test_a_drop_in_that_is_not_imported_is_explained() -> None:
    main = fixture("v1.20.0", "ctrd-custom-v2-systemd").replace('imports = ["/etc/containerd/conf.d/*.toml"]\n', "")
    state = containerd_state(main, main)
    state["containerd_dropins"] = {"/etc/containerd/conf.d/99-nvidia.toml": (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        'runtime_type = "io.containerd.runc.v2"\n')}
    findings = failures(runtime_diagnosis.diagnose(state, NodeSettings()))
    assert any(line.startswith("/etc/containerd/conf.d/99-nvidia.toml: defines the nvidia runtime, but "
                               "/etc/containerd/config.toml does not import it") for line in findings[0].evidence)


def test_docker_nvidia_runtime_with_another_binary_is_not_called_missing() -> None:
    state = {"installed": ["docker", "docker-cli"], "active": {"docker": "active"}, "containerd_config": None,
             "containerd_dropins": {}, "containerd_dump": None, "containerd_default": None,
             "docker_config": '{"runtimes": {"nvidia": {"path": "/opt/other/runtime"}}}'}
    findings = failures(runtime_diagnosis.diagnose(state, NodeSettings()))
    assert findings[0].what == "/etc/docker/daemon.json's nvidia runtime runs '/opt/other/runtime', not " \
                               "/usr/bin/nvidia-container-runtime"
    assert "/etc/docker/daemon.json: runtimes = nvidia" in findings[0].evidence


def test_docker_without_its_client_is_named_before_anything_is_changed() -> None:
    """Debian unstable's docker.io 28 only recommends docker-cli: the daemon runs, nothing can ask it."""
    state = {"installed": ["containerd", "docker"], "active": {"docker": "active", "containerd": "active"},
             "containerd_config": None, "containerd_dropins": {}, "containerd_dump": None, "containerd_default": None,
             "docker_config": None}
    findings = failures(runtime_diagnosis.diagnose(state, NodeSettings()))
    assert [f.code for f in findings] == ["docker-cli-missing"]
    assert findings[0].evidence == ["command -v docker: not found (installed: containerd, docker)"]
    assert "apt-get install docker-cli" in findings[0].fix
    state["installed"].append("docker-cli")
    assert "docker-cli-missing" not in {f.code for f in failures(runtime_diagnosis.diagnose(state, NodeSettings()))}


RPM_REPO = ["[nvidia-container-toolkit]", "name=NVIDIA Container Toolkit",
            "baseurl=https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch", "enabled=1", "gpgcheck=1",
            "repo_gpgcheck=1", "gpgkey=file:///etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit"]
RPM_OK = {"family": "rpm", "os_release": "ID=rocky ID_LIKE=rhel centos fedora", "keyring_fingerprints": [],
          "list": None, "stale_lists": [], "repo_file": RPM_REPO,
          "rpm_key_fingerprints": ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"], "rpm_trusted_keys": ["f796ecb0"],
          "stale_repos": []}


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, []),
    ({"rpm_key_fingerprints": []}, ["key file /etc/pki/rpm-gpg/RPM-GPG-KEY-nvidia-container-toolkit is missing"]),
    ({"rpm_key_fingerprints": ["0" * 40]}, ["holds a key other than the pinned one"]),
    ({"rpm_trusted_keys": ["fd431d51"]}, ["rpm does not trust the toolkit key"]),
    ({"repo_file": None}, ["repository file /etc/yum.repos.d/nvidia-container-toolkit.repo is missing"]),
    ({"repo_file": [line.replace("gpgcheck=1", "gpgcheck=0") for line in RPM_REPO]}, ["is not the pinned one"]),
    ({"stale_repos": ["/etc/yum.repos.d/nvidia-docker.repo"]}, ["stale NVIDIA repository files"]),
    ({"family": None, "os_release": "ID=arch"}, ["cannot tell whether this host installs packages with apt or dnf"]),
])
def test_toolkit_repo_diagnosis_on_the_rpm_family(changes: dict, expected: list[str]) -> None:
    findings = repo_diagnosis.diagnose({**RPM_OK, **changes}, NodeSettings())
    failed = failures(findings)
    assert [text for text, finding in zip(expected, failed, strict=True) if text in finding.what] == expected
    if not expected:  # the proof says which family and quotes the key, the trust and the file as read
        evidence = " | ".join(findings[-1].evidence)
        assert "(dnf)" in evidence and "C95B321B61E88C1809C4F759DDCAE044F796ECB0" in evidence
        assert "gpg-pubkey-f796ecb0" in evidence and "repo_gpgcheck=1" in evidence
    if changes.get("family", "rpm") is None:
        assert failed[0].evidence == ["/etc/os-release: ID=arch"]


HOST_OK = {"config": {"error": None, "ldconfig": "@/sbin/ldconfig", "mode": "auto"},
           "paths": {"/sbin/ldconfig": True, "/sbin/ldconfig.real": False},
           "modes": {"/usr/bin/nvidia-container-runtime": "755", "/usr/bin/nvidia-ctk": "755"}, "cdi_specs": []}


CDI_SPEC = {"config": {**HOST_OK["config"], "mode": "cdi"}, "cdi_specs": ["/etc/cdi/nvidia.yaml"],
            "cdi_devices": {"/etc/cdi/nvidia.yaml": ["0", "1", "GPU-aaa", "GPU-bbb", "all"]}}
CDI_GPUS = [{"index": 0, "uuid": "GPU-aaa"}, {"index": 1, "uuid": "GPU-bbb"}]


def test_a_stale_cdi_spec_is_judged_where_containerd_uses_cdi() -> None:
    """cdi_enabled (the CRI plugin injects CDI devices for the cdi-cri strategy) judges the spec in any mode."""
    state = {"family": "deb", "versions": dict.fromkeys(PACKAGES, "1.17.8-1"), "held": list(PACKAGES), "locks": {},
             **HOST_OK, **CDI_SPEC, "config": HOST_OK["config"], "cdi_gpus": [{"index": 0, "uuid": "GPU-new"}]}
    failed = failures(toolkit_diagnosis.diagnose(state, NodeSettings(cdi_enabled=True)))
    assert [f.code for f in failed] == ["toolkit-cdi-spec-stale"]
    assert failed[0].fix.startswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")
    assert "nvidia-smi --query-gpu=index,uuid: 0 GPU-new" in failed[0].evidence


@pytest.mark.parametrize(("strategy", "cdi_enabled", "codes"), [
    ("cdi-cri", True, ["toolkit-cdi-spec-missing"]),  # the plugin names nvidia.com/gpu devices no spec defines
    ("cdi-annotations", False, ["toolkit-cdi-spec-missing"]),
    ("envvar", True, []),  # CDI on in containerd, but nothing names a CDI device
    ("volume-mounts", True, []),
])
def test_a_cdi_device_list_strategy_needs_the_nodes_spec(strategy: str, cdi_enabled: bool, codes: list[str]) -> None:
    state = {"family": "deb", "versions": dict.fromkeys(PACKAGES, "1.17.8-1"), "held": list(PACKAGES), "locks": {},
             **HOST_OK, "config": {**HOST_OK["config"], "volume_mounts": True}}
    settings = NodeSettings(cdi_enabled=cdi_enabled, plugin_device_list_strategy=strategy)
    failed = failures(toolkit_diagnosis.diagnose(state, settings))
    assert [f.code for f in failed] == codes
    if codes:
        assert f"inventory: plugin_device_list_strategy = {strategy}" in failed[0].evidence
        assert failed[0].fix.startswith("nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml")


@pytest.mark.parametrize(("value", "version", "used"), [
    ("@/sbin/ldconfig.real", "1.17.8-1", "@/sbin/ldconfig"),  # Ubuntu's config on Debian works since 1.15
    ("@/sbin/ldconfig.real", "1.14.6-1", "@/sbin/ldconfig.real"),  # ... but not before: the hook passes it on
    ("@/sbin/ldconfig", "1.17.8-1", "@/sbin/ldconfig.real"),  # where .real exists (Ubuntu), the hook takes it
    ("@/opt/ldconfig", "1.20.0-1", "@/opt/ldconfig"),
])
def test_the_ldconfig_is_resolved_as_nvidias_hook_resolves_it(value: str, version: str, used: str) -> None:
    """As the toolkit's ldconfigPath.normalize (internal/config/cli.go, 1.17.8; CHANGELOG v1.15.0-rc.1)."""
    paths = {"/sbin/ldconfig": True, "/sbin/ldconfig.real": value == "@/sbin/ldconfig"}
    assert toolkit_diagnosis.hook_ldconfig(value, paths, dict.fromkeys(PACKAGES, version)) == used
    # a toolkit package removed (its version None): the others' version still says what the hook does
    removed = {**dict.fromkeys(PACKAGES, version), "nvidia-container-toolkit": None}
    assert toolkit_diagnosis.hook_ldconfig(value, paths, removed) == used


@pytest.mark.parametrize(("changes", "code", "said"), [
    ({}, None, 'config.toml: ldconfig = "@/sbin/ldconfig" (/sbin/ldconfig exists)'),
    ({"config": None}, None, "config.toml: absent (the runtime uses nvidia-ctk's defaults for this host)"),
    # Ubuntu's wrapper on Debian: NVIDIA's hook (1.15 and later) uses /sbin/ldconfig instead, so nothing fails
    ({"config": {**HOST_OK["config"], "ldconfig": "@/sbin/ldconfig.real"}}, None,
     'ldconfig = "@/sbin/ldconfig.real" (/sbin/ldconfig exists, the path NVIDIA\'s hook uses for '
     '@/sbin/ldconfig.real)'),
    # a path that is on no host (a custom glibc's, since removed): fails on every version
    ({"config": {**HOST_OK["config"], "ldconfig": "@/opt/glibc/sbin/ldconfig"},
      "paths": {**HOST_OK["paths"], "/opt/glibc/sbin/ldconfig": False}}, "toolkit-ldconfig-missing",
     "nvidia-container-cli: ldcache error: open failed: /opt/glibc/sbin/ldconfig: no such file or directory"),
    ({"config": {**HOST_OK["config"], "ldconfig": "/sbin/ldconfig"}}, "toolkit-ldconfig-in-container",
     'nvidia-container-cli.ldconfig value "/sbin/ldconfig" is not host-relative (does not start with a \'@\')'),
    ({"config": {"error": "Unterminated string (at end of document)", "ldconfig": None, "mode": None}},
     "toolkit-config-invalid", "Unterminated string"),
    ({"modes": {"/usr/bin/nvidia-container-runtime": "644", "/usr/bin/nvidia-ctk": "755"}}, "toolkit-not-executable",
     "stat -c %a /usr/bin/nvidia-container-runtime: 644"),
    ({"config": {**HOST_OK["config"], "mode": "cdi"}}, "toolkit-cdi-spec-missing", 'mode = "cdi"'),
    ({"config": {**HOST_OK["config"], "mode": "cdi"}, "cdi_specs": ["/etc/cdi/nvidia.yaml"]}, None,
     "1 CDI spec(s): /etc/cdi/nvidia.yaml"),
    # device names as nvidia-ctk cdi generate writes them (index, GPU UUID, all; tests/facts/toolkit...gpu_replaced)
    ({**CDI_SPEC, "cdi_gpus": CDI_GPUS}, None,
     "/etc/cdi/nvidia.yaml: 5 nvidia.com/gpu device(s), naming 2 of the 2 GPU(s) nvidia-smi lists by UUID"),
    ({**CDI_SPEC, "cdi_gpus": [CDI_GPUS[0], {"index": 1, "uuid": "GPU-new"}]}, "toolkit-cdi-spec-stale",
     "devices for GPU(s) this node does not have: GPU-bbb"),
    ({**CDI_SPEC, "cdi_gpus": CDI_GPUS + [{"index": 2, "uuid": "GPU-ccc"}]}, "toolkit-cdi-spec-stale",
     "no device for GPU(s) GPU-ccc"),
    ({**CDI_SPEC, "cdi_gpus": CDI_GPUS, "cdi_errors": {"/etc/cdi/nvidia.yaml": "mapping values are not allowed"}},
     "toolkit-cdi-spec-invalid", "/etc/cdi/nvidia.yaml: mapping values are not allowed"),
    # CDI not used (mode auto, CDI not enabled): a stale spec harms nothing and is not judged
    ({**CDI_SPEC, "config": HOST_OK["config"], "cdi_gpus": [{"index": 0, "uuid": "GPU-new"}]}, None,
     "/etc/cdi/nvidia.yaml: 5 nvidia.com/gpu device(s), naming 0 of the 1 GPU(s)"),
])
def test_toolkit_diagnosis_judges_what_the_host_must_do_for_the_toolkit(changes: dict, code: str | None,
                                                                        said: str) -> None:
    state = {"family": "deb", "versions": dict.fromkeys(PACKAGES, "1.17.8-1"), "held": list(PACKAGES), "locks": {},
             **HOST_OK, **changes}
    findings = toolkit_diagnosis.diagnose(state, NodeSettings())
    failed = failures(findings)
    assert [f.code for f in failed] == ([code] if code else [])
    evidence = " | ".join(failed[0].evidence + [failed[0].what] if failed else findings[-1].evidence)
    assert said in evidence, evidence
    if code == "toolkit-ldconfig-missing":
        assert "--set nvidia-container-cli.ldconfig=@/sbin/ldconfig " in failed[0].fix


@pytest.mark.parametrize(("locks", "expected"), [
    ({p: "1.17.8-1" for p in PACKAGES}, []),
    ({}, ["not held"]),
    ({**{p: "1.17.8-1" for p in PACKAGES}, "libnvidia-container1": "1.20.0-1"}, ["dnf versionlock holds"]),
])
def test_toolkit_diagnosis_reads_dnf_versionlock_as_the_hold(locks: dict, expected: list[str]) -> None:
    state = {"family": "rpm", "versions": dict.fromkeys(PACKAGES, "1.17.8-1"),
             "held": sorted(n for n, v in locks.items() if v), "locks": locks}
    findings = toolkit_diagnosis.diagnose(state, NodeSettings())
    failed = failures(findings)
    assert [text for text, finding in zip(expected, failed, strict=True) if text in finding.what] == expected
    if expected == ["not held"]:
        assert "dnf versionlock add" in failed[0].fix
    if not expected:
        assert all("rpm -q" in line and "locked by dnf versionlock" in line for line in findings[-1].evidence[:4])


def test_persistence_mode_off_is_a_warning_with_its_evidence() -> None:
    state = driver_state(health=[{"index": 0, "ecc_uncorrected": 0, "retired_pending": "No", "compute_mode": "Default",
                                  "persistence_mode": "Enabled"},
                                 {"index": 1, "ecc_uncorrected": 0, "retired_pending": "No", "compute_mode": "Default",
                                  "persistence_mode": "Disabled"}])
    findings = driver_diagnosis.diagnose(state, NodeSettings())
    warned = [f for f in findings if f.code == "persistence-mode-off"]
    assert len(warned) == 1 and not warned[0].breaks and not failures(findings)
    assert warned[0].evidence == ["nvidia-smi persistence_mode: GPU 1 Disabled"]
    assert "nvidia-persistenced" in warned[0].fix


@pytest.mark.parametrize(("strategy", "config", "found"), [
    ("envvar", {**HOST_OK["config"], "volume_mounts": False}, False),
    ("volume-mounts", {**HOST_OK["config"], "volume_mounts": True}, False),
    ("volume-mounts", {**HOST_OK["config"], "volume_mounts": False}, True),
    ("volume-mounts", None, True),  # no config.toml: the hook's defaults, which do not take mounts
])
def test_the_volume_mounts_strategy_needs_the_hook_to_take_devices_from_mounts(strategy: str, config: dict | None,
                                                                                found: bool) -> None:
    state = {"family": "deb", "versions": dict.fromkeys(PACKAGES, "1.17.8-1"), "held": list(PACKAGES), "locks": {},
             **HOST_OK, "config": config}
    failed = failures(toolkit_diagnosis.diagnose(state, NodeSettings(plugin_device_list_strategy=strategy)))
    assert [f.code for f in failed] == (["toolkit-volume-mounts-refused"] if found else [])
    if found:
        assert "device error: /var/run/nvidia-container-devices: unknown device" in failed[0].what
        assert failed[0].fix.startswith("nvidia-ctk config --in-place --config-file=/etc/nvidia-container-runtime/"
                                        "config.toml --set accept-nvidia-visible-devices-as-volume-mounts=true")
