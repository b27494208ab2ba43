"""Diagnosis of the runtime step: does the runtime's EFFECTIVE config hand GPUs to containers as asked?

Reads containerd's merged config (``containerd config dump``), so a runtime
written by either toolkit layout (in place, or drop-in plus ``imports``) counts,
and a drop-in that shadows the main config is seen as containerd sees it.
"""

from __future__ import annotations

import json
import tomllib

from gpunode.diagnosis import Finding, Severity
from gpunode.facts.runtime import CONTAINERD_CONFIG, DOCKER_CONFIG
from gpunode.settings import NodeSettings

STEP = "runtime"
CDI_SINCE = (1, 7)  # containerd 1.6 has no enable_cdi
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
# the CRI plugin's table per config version: version 1 (no version key, still read by containerd 1.6 and 1.7)
# names it "cri"
CRI_PLUGINS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}


def fail(code: str, what: str, evidence: list[str], fix: str) -> Finding:
    return Finding(STEP, Severity.FAIL, what, evidence, fix, code)


def chosen_runtime(state: dict, settings: NodeSettings) -> str | None:
    """The runtime to configure: the inventory's choice, else docker when dockerd exists, else containerd."""
    if settings.container_runtime != "auto":
        return settings.container_runtime
    for runtime in ("docker", "containerd"):
        if runtime in state["installed"]:
            return runtime
    return None


def parse_toml(text: str) -> tuple[dict, str | None]:
    """The parsed document, or an empty one and the parser's error (with line and column)."""
    try:
        return tomllib.loads(text), None
    except tomllib.TOMLDecodeError as error:
        return {}, str(error)


def json_error(text: str) -> str | None:
    if not text.strip():
        return "the file is empty (docker and nvidia-ctk both refuse it: 'unable to load config ... EOF')"
    try:
        json.loads(text)
    except json.JSONDecodeError as error:
        return f"{error.msg} (line {error.lineno}, column {error.colno})"
    return None


def config_version(config: dict) -> int:
    """The config's schema version as containerd reads it: a file without ``version`` is version 1."""
    version = config.get("version", 1)
    return version if isinstance(version, int) and version in CRI_PLUGINS else 2


def cri_table(config: dict) -> dict:
    plugins = config.get("plugins")
    table = plugins.get(CRI_PLUGINS[config_version(config)]) if isinstance(plugins, dict) else None
    return table if isinstance(table, dict) else {}


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    runtime = chosen_runtime(state, settings)
    if runtime is None:
        return [fail("no-runtime", "no container runtime is installed (neither containerd nor docker)",
                     [f"installed: {', '.join(state['installed']) or 'none'}"],
                     "install the node's runtime first (containerd for Kubernetes)")]
    if runtime not in state["installed"]:
        return [fail("no-runtime", f"container_runtime is {runtime} but {runtime} is not installed",
                     [f"installed: {', '.join(state['installed']) or 'none'}"],
                     f"install {runtime}, or set container_runtime to one that is installed")]
    findings = diagnose_containerd(state, settings) if runtime == "containerd" else diagnose_docker(state, settings)
    status = state["active"].get(runtime, "unknown")
    if status != "active" and not any(f.code == "config-invalid" for f in findings):
        findings.append(fail("runtime-down", f"{runtime} is not running", [f"systemctl is-active {runtime}: {status}"],
                             f"systemctl restart {runtime}; journalctl -u {runtime} -n 50 says why it stopped"))
    return findings


def diagnose_containerd(state: dict, settings: NodeSettings) -> list[Finding]:
    text = state["containerd_config"]
    written = []  # the config files as written (main config first), parsed once
    files = ([(CONTAINERD_CONFIG, text)] if text is not None else []) + list(state["containerd_dropins"].items())
    for path, content in files:
        document, error = parse_toml(content)
        if error:
            fix = (f"repair {CONTAINERD_CONFIG} by hand (or move it away to get a fresh base config)"
                   if path == CONTAINERD_CONFIG else f"repair or remove {path}")
            return [fail("config-invalid", f"{path} is not valid TOML: gpunode will not touch it", [error], fix)]
        written.append(document)
    dump = state["containerd_dump"]
    if dump is None or dump["rc"] != 0:
        said = (dump.get("stderr") or dump["text"]).splitlines()[-3:] if dump else []
        return [fail("config-rejected", "containerd rejects its configuration ('containerd config dump' failed)",
                     [f"containerd config dump: {line}" for line in said] or ["containerd config dump: not run"],
                     f"repair {CONTAINERD_CONFIG}; 'containerd config dump' must succeed")]
    effective, error = parse_toml(dump["text"])
    if error:
        return [fail("dump-unreadable", "'containerd config dump' printed something that is not TOML",
                     [f"parser: {error}", *(f"containerd config dump: {line}"
                                             for line in dump["text"].splitlines()[:2])],
                     "run 'containerd config dump' on the node and look at what it prints (a wrapper script or "
                     "an unusual containerd build)")]
    cri = cri_table(effective)
    runtimes = cri.get("containerd", {}).get("runtimes", {})
    findings = []
    # 'config dump' adds containerd's built-in runc when the files define no runtime at all, so whether a
    # base config exists is read from the files themselves: Debian's stub plus nvidia breaks the CRI plugin.
    if text is None or not any("runc" in cri_table(doc).get("containerd", {}).get("runtimes", {}) for doc in written):
        findings.append(fail("base-config-missing",
                             f"{CONTAINERD_CONFIG} is {'missing' if text is None else 'a stub without a runc runtime'}"
                             ": the CRI plugin has no base runtime for nvidia to copy",
                             [f"effective runtimes: {', '.join(runtimes) or 'none'}"],
                             "gpunode writes 'containerd config default' as the base (re-run deploys/runtime.py)"))
    nvidia = runtimes.get("nvidia")
    binary = (nvidia or {}).get("options", {}).get("BinaryName")
    if nvidia is None or binary != RUNTIME_BINARY:
        findings.append(fail("nvidia-runtime-missing",
                             "containerd's effective config has no nvidia runtime" if nvidia is None
                             else f"containerd's nvidia runtime runs {binary!r}, not {RUNTIME_BINARY}",
                             [f"containerd config dump: runtimes = {', '.join(runtimes) or 'none'}"],
                             "re-run deploys/runtime.py (nvidia-ctk runtime configure --runtime=containerd)"))
    default = cri.get("containerd", {}).get("default_runtime_name", "runc")
    if settings.nvidia_runtime_default != (default == "nvidia"):
        want = "nvidia" if settings.nvidia_runtime_default else "not nvidia"
        findings.append(fail("default-runtime-wrong", f"containerd's default runtime is {default!r}; the inventory "
                             f"asks for {want} (nvidia_runtime_default: {settings.nvidia_runtime_default})",
                             [f"containerd config dump: default_runtime_name = {default!r}"],
                             "re-run deploys/runtime.py"))
    version = state.get("containerd_version")
    if settings.cdi_enabled and version and tuple(int(p) for p in version.split(".")[:2]) < CDI_SINCE:
        findings.append(fail("cdi-unsupported", f"cdi_enabled asks for CDI, but containerd {version} does not know "
                             "enable_cdi (it drops the key from its effective config); CDI in the CRI plugin needs "
                             f"containerd {'.'.join(map(str, CDI_SINCE))} or newer",
                             [f"containerd --version: {version}"],
                             "upgrade containerd on this node, or set cdi_enabled = False for it (the device plugin's "
                             "envvar or volume-mounts strategy works without CDI)"))
    elif settings.cdi_enabled and not cri.get("enable_cdi", False):
        findings.append(fail("cdi-missing", "CDI is not enabled in containerd's CRI plugin (cdi_enabled: true)",
                             ["containerd config dump: enable_cdi is false"], "re-run deploys/runtime.py"))
    status = state.get("cri_status")
    if status not in (None, "ok") and state["active"].get("containerd") == "active":
        findings.append(fail("cri-plugin-failed", "containerd runs but its CRI plugin failed to load: kubelet "
                             "cannot start pods", [f"ctr plugins ls: cri {status}"],
                             "journalctl -u containerd | grep 'failed to load plugin io.containerd.grpc.v1.cri' "
                             "says why; re-run deploys/runtime.py"))
    return findings


def diagnose_docker(state: dict, settings: NodeSettings) -> list[Finding]:
    text = state["docker_config"]
    config: dict = {}
    if text is not None:
        error = json_error(text)
        if error and text.strip():
            return [fail("config-invalid", f"{DOCKER_CONFIG} is not valid JSON: gpunode will not touch it", [error],
                         f"repair {DOCKER_CONFIG} by hand")]
        config = json.loads(text) if not error else {}
    findings = []
    nvidia = config.get("runtimes", {}).get("nvidia")
    if not nvidia or nvidia.get("path") not in ("nvidia-container-runtime", RUNTIME_BINARY):
        findings.append(fail("nvidia-runtime-missing", f"{DOCKER_CONFIG} has no nvidia runtime",
                             [f"{DOCKER_CONFIG}: runtimes = {', '.join(config.get('runtimes', {})) or 'none'}"
                              + (" (file absent)" if text is None else " (file empty)" if not text.strip() else "")],
                             "re-run deploys/runtime.py (nvidia-ctk runtime configure --runtime=docker)"))
    default = config.get("default-runtime", "runc")
    if settings.nvidia_runtime_default != (default == "nvidia"):
        want = "nvidia" if settings.nvidia_runtime_default else "not nvidia"
        findings.append(fail("default-runtime-wrong", f"docker's default runtime is {default!r}; the inventory "
                             f"asks for {want} (nvidia_runtime_default: {settings.nvidia_runtime_default})",
                             [f"{DOCKER_CONFIG}: default-runtime = {default!r}"], "re-run deploys/runtime.py"))
    if settings.cdi_enabled and not config.get("features", {}).get("cdi", False):
        findings.append(fail("cdi-missing", "CDI is not enabled in docker (cdi_enabled: true)",
                             [f"{DOCKER_CONFIG}: features.cdi is not true"], "re-run deploys/runtime.py"))
    return findings
