"""Diagnosis of the runtime step: does the runtime's EFFECTIVE config hand GPUs to containers as asked?

Reads containerd's merged config (``containerd config dump``), so a runtime
written by either toolkit layout (in place, or drop-in plus ``imports``) counts,
and a drop-in that shadows the main config is seen as containerd sees it.
"""

from __future__ import annotations

import fnmatch
import json
import tomllib

from gpunode.diagnosis import Finding, Verdict, with_proof
from gpunode.facts.runtime import CONTAINERD_CONFIG, DOCKER_CONFIG
from gpunode.settings import NodeSettings

STEP = "runtime"
CDI_SINCE = (1, 7)  # containerd 1.6 has no enable_cdi
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
# the CRI plugin's table per config version: version 1 (no version key, still read by containerd 1.6 and 1.7)
# names it "cri"
CRI_PLUGINS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# names that switch the CRI plugin off in disabled_plugins (schema 1 takes the short id)
CRI_IDS = {"cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"}
# the runc options the nvidia runtime must share with runc (the cgroup driver above all): nvidia-ctk copies them
SHARED_OPTIONS = ("SystemdCgroup", "Root", "NoPivotRoot", "NoNewKeyring", "IoUid", "IoGid", "CriuPath")


def fail(code: str, what: str, evidence: list[str], fix: str) -> Finding:
    return Finding(STEP, Verdict.FINDING, what, evidence, fix, code)


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
    findings, proof = (diagnose_containerd(state, settings) if runtime == "containerd"
                       else diagnose_docker(state, settings))
    status = state["active"].get(runtime, "unknown")
    if status != "active" and not any(f.code == "config-invalid" for f in findings):
        findings.append(fail("runtime-down", f"{runtime} is not running", [f"systemctl is-active {runtime}: {status}"],
                             f"systemctl restart {runtime}; journalctl -u {runtime} -n 50 says why it stopped"))
    default = "nvidia" if settings.nvidia_runtime_default else "not nvidia"
    return with_proof(findings, STEP, f"{runtime} runs with the nvidia runtime ({default} as the default"
                      + (", CDI on" if settings.cdi_enabled else "") + ")",
                      [f"systemctl is-active {runtime}: {status}", *proof])


def setting_files(files: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The files containerd reads: the main config and the drop-ins its ``imports`` reach."""
    main = dict(files[0][1]) if files and files[0][0] == CONTAINERD_CONFIG else {}
    return [(path, doc) for path, doc in files if path == CONTAINERD_CONFIG or imported(main, path)]


def where_set(files: list[tuple[str, dict]], *keys: str) -> str:
    """The last file that sets the key path (containerd merges in that order), for 'where it was read'."""
    found = ""
    for path, document in files:
        node: object = cri_table(document)
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            found = path
    return f" (set in {found})" if found else " (containerd's built-in default: no file sets it)"


def imported(main: dict, path: str) -> bool:
    """Whether the main config's ``imports`` reaches ``path`` (globs as containerd expands them)."""
    patterns = main.get("imports") or []
    return any(fnmatch.fnmatch(path, pattern) for pattern in patterns if isinstance(pattern, str))


def unread_nvidia(files: list[tuple[str, dict]]) -> list[str]:
    """Why an nvidia runtime written in a file is not in the effective config, one line per such file."""
    main = dict(files[0][1]) if files and files[0][0] == CONTAINERD_CONFIG else {}
    lines = []
    for path, document in files:
        plugins = document.get("plugins") if isinstance(document.get("plugins"), dict) else {}
        for name, table in plugins.items():
            runtimes = table.get("containerd", {}).get("runtimes", {}) if isinstance(table, dict) else {}
            if not isinstance(runtimes, dict) or "nvidia" not in runtimes:
                continue
            expected = CRI_PLUGINS[config_version(document)]
            if name != expected:
                lines.append(f"{path}: defines the nvidia runtime under plugins.{name!r}, but a version "
                             f"{config_version(document)} config is read from plugins.{expected!r}")
            elif path != CONTAINERD_CONFIG and not imported(main, path):
                lines.append(f"{path}: defines the nvidia runtime, but {CONTAINERD_CONFIG} does not import it "
                             f"(imports = {main.get('imports', [])})")
    return lines


def diagnose_containerd(state: dict, settings: NodeSettings) -> tuple[list[Finding], list[str]]:
    """containerd's findings and, for the proof, what was read that shows the nvidia runtime in place."""
    text = state["containerd_config"]
    every = []  # the config files as written (main config first, then the drop-ins in name order), parsed once
    files = ([(CONTAINERD_CONFIG, text)] if text is not None else []) + sorted(state["containerd_dropins"].items())
    for path, content in files:
        document, error = parse_toml(content)
        if error:
            fix = (f"repair {CONTAINERD_CONFIG} by hand (or move it away to get a fresh base config)"
                   if path == CONTAINERD_CONFIG else f"repair or remove {path}")
            return [fail("config-invalid", f"{path} is not valid TOML: gpunode will not touch it", [error], fix)], []
        every.append((path, document))
    dump = state["containerd_dump"]
    if dump is None or dump["rc"] != 0:
        said = (dump.get("stderr") or dump["text"]).splitlines()[-3:] if dump else []
        return [fail("config-rejected", "containerd rejects its configuration ('containerd config dump' failed)",
                     [f"containerd config dump: {line}" for line in said]
                     or [f"containerd config dump: no output (rc {dump['rc'] if dump else 'none: not run'})"],
                     f"repair {CONTAINERD_CONFIG}; 'containerd config dump' must succeed")], []
    effective, error = parse_toml(dump["text"])
    if error:
        return [fail("dump-unreadable", "'containerd config dump' printed something that is not TOML",
                     [f"parser: {error}", *(f"containerd config dump: {line}"
                                             for line in dump["text"].splitlines()[:2])],
                     "run 'containerd config dump' on the node and look at what it prints (a wrapper script or "
                     "an unusual containerd build)")], []
    parsed = setting_files(every)
    disabled = [p for p in effective.get("disabled_plugins") or [] if p in CRI_IDS]
    if disabled:
        source = next((path for path, doc in reversed(parsed)
                       if any(p in CRI_IDS for p in doc.get("disabled_plugins") or [])), CONTAINERD_CONFIG)
        return [fail("cri-disabled", "containerd's CRI plugin is disabled: the kubelet cannot run pods through "
                     "containerd, and no nvidia runtime can be configured in it",
                     [f"containerd config dump: disabled_plugins = {effective.get('disabled_plugins')}",
                      f"{source}: disabled_plugins lists {', '.join(repr(p) for p in disabled)}"],
                     f"remove {', '.join(repr(p) for p in disabled)} from disabled_plugins in {source} (the "
                     "containerd.io package's config disables CRI; a Kubernetes node needs it), then re-run "
                     "deploys/runtime.py")], []
    cri = cri_table(effective)
    table = f"plugins.{CRI_PLUGINS[config_version(effective)]!r}"
    runtimes = cri.get("containerd", {}).get("runtimes", {})
    findings = []
    # 'config dump' adds containerd's built-in runc when the files define no runtime at all, so whether a
    # base config exists is read from the files themselves: Debian's stub plus nvidia breaks the CRI plugin.
    if text is None or not any("runc" in cri_table(doc).get("containerd", {}).get("runtimes", {})
                               for _, doc in every):
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
                             [f"containerd config dump: {table}.containerd.runtimes = {', '.join(runtimes) or 'none'}"]
                             + ([] if nvidia is None else [f"containerd config dump: nvidia BinaryName = {binary!r}"
                                                           + where_set(parsed, "containerd", "runtimes", "nvidia",
                                                                       "options", "BinaryName")])
                             + (unread_nvidia(every) if nvidia is None else []),
                             "re-run deploys/runtime.py (nvidia-ctk runtime configure --runtime=containerd)"))
    else:
        findings += option_drift(runtimes, parsed)
    default = cri.get("containerd", {}).get("default_runtime_name", "runc")
    default_line = f"containerd config dump: default_runtime_name = {default!r}" + where_set(
        parsed, "containerd", "default_runtime_name")
    if settings.nvidia_runtime_default != (default == "nvidia"):
        want = "nvidia" if settings.nvidia_runtime_default else "not nvidia"
        findings.append(fail("default-runtime-wrong", f"containerd's default runtime is {default!r}; the inventory "
                             f"asks for {want} (nvidia_runtime_default: {settings.nvidia_runtime_default})",
                             [default_line], "re-run deploys/runtime.py"))
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
                             [f"containerd config dump: enable_cdi = {cri.get('enable_cdi', False)!r}"
                              + where_set(parsed, "enable_cdi")], "re-run deploys/runtime.py"))
    status = state.get("cri_status")
    if state["active"].get("containerd") == "active" and status not in (None, "ok"):
        findings.append(cri_status_finding(status))
    proof = [f"containerd config dump: {table}.containerd.runtimes = {', '.join(runtimes)}",
             f"containerd config dump: nvidia BinaryName = {binary!r}"
             + where_set(parsed, "containerd", "runtimes", "nvidia", "options", "BinaryName"), default_line]
    if settings.cdi_enabled:
        proof.append(f"containerd config dump: enable_cdi = {cri.get('enable_cdi')!r}")
    proof.append(f"ctr plugins ls: cri {status}" if status else "ctr plugins ls: not run (containerd not active "
                 "or ctr missing)")
    return findings, proof


def cri_status_finding(status: str) -> Finding:
    if status == "absent":
        return fail("cri-plugin-missing", "containerd runs without a CRI plugin: the kubelet cannot run pods "
                    "through it", [f"ctr plugins ls: cri {status} (no plugin with id cri listed)"],
                    "containerd was built or configured without CRI: read 'containerd config dump' "
                    "(disabled_plugins, plugin_dir) and journalctl -u containerd")
    if status.startswith("unanswered"):
        return fail("runtime-unanswered", "containerd is active but does not answer on its socket",
                    [f"ctr plugins ls: {status}"],
                    "journalctl -u containerd -n 50; systemctl restart containerd")
    return fail("cri-plugin-failed", "containerd runs but its CRI plugin failed to load: kubelet cannot start "
                "pods", [f"ctr plugins ls: cri {status}"],
                "journalctl -u containerd | grep 'failed to load plugin io.containerd.grpc.v1.cri' says why; "
                "re-run deploys/runtime.py")


def option_drift(runtimes: dict, parsed: list[tuple[str, dict]]) -> list[Finding]:
    """The nvidia runtime must run containers as runc does (same type, same cgroup driver and options)."""
    runc, nvidia = runtimes.get("runc") or {}, runtimes.get("nvidia") or {}
    if not runc:
        return []
    lines = []
    if runc.get("runtime_type") != nvidia.get("runtime_type"):
        lines.append(f"runtime_type: runc {runc.get('runtime_type')!r}, nvidia {nvidia.get('runtime_type')!r}"
                     + where_set(parsed, "containerd", "runtimes", "nvidia", "runtime_type"))
    for key in SHARED_OPTIONS:
        mine, theirs = (runc.get("options") or {}).get(key), (nvidia.get("options") or {}).get(key)
        if mine != theirs and not (key == "SystemdCgroup" and not mine and not theirs):
            lines.append(f"options.{key}: runc {mine!r}, nvidia {theirs!r}"
                         + where_set(parsed, "containerd", "runtimes", "nvidia", "options", key))
    if not lines:
        return []
    return [fail("nvidia-options-differ", "containerd's nvidia runtime runs containers differently from runc "
                 "(GPU pods get another cgroup driver or runtime than every other pod)",
                 [f"containerd config dump: {line}" for line in lines],
                 "make the nvidia runtime's options equal runc's in the file named above (nvidia-ctk copies runc's "
                 "options when it adds the runtime; one of them was changed by hand since)")]


def diagnose_docker(state: dict, settings: NodeSettings) -> tuple[list[Finding], list[str]]:
    """docker's findings and, for the proof, what daemon.json says."""
    text = state["docker_config"]
    config: dict = {}
    if text is not None:
        error = json_error(text)
        if error and text.strip():
            return [fail("config-invalid", f"{DOCKER_CONFIG} is not valid JSON: gpunode will not touch it", [error],
                         f"repair {DOCKER_CONFIG} by hand")], []
        config = json.loads(text) if not error else {}
    if not isinstance(config, dict):
        return [fail("config-invalid", f"{DOCKER_CONFIG} is JSON but not an object: gpunode will not touch it",
                     [f"{DOCKER_CONFIG}: a {type(config).__name__}"], f"repair {DOCKER_CONFIG} by hand")], []
    if "docker-cli" not in state["installed"]:
        return [fail("docker-cli-missing", "docker's client (the docker command) is not installed: without it "
                     "nothing on the node, gpunode included, can ask the daemon whether it runs after a restart",
                     [f"command -v docker: not found (installed: {', '.join(state['installed'])})"],
                     "apt-get install docker-cli (Debian unstable's docker.io only recommends it; an install "
                     "with --no-install-recommends leaves it out), then re-run deploys/runtime.py")], []
    findings = []
    runtimes = config.get("runtimes") if isinstance(config.get("runtimes"), dict) else {}
    nvidia = runtimes.get("nvidia")
    path = nvidia.get("path") if isinstance(nvidia, dict) else None
    listed = (f"{DOCKER_CONFIG}: runtimes = {', '.join(runtimes) or 'none'}"
              + (" (file absent)" if text is None else " (file empty)" if not text.strip() else ""))
    if path not in ("nvidia-container-runtime", RUNTIME_BINARY):
        findings.append(fail("nvidia-runtime-missing", f"{DOCKER_CONFIG} has no nvidia runtime" if nvidia is None
                             else f"{DOCKER_CONFIG}'s nvidia runtime runs {path!r}, not {RUNTIME_BINARY}",
                             [listed] + ([] if nvidia is None else [f"{DOCKER_CONFIG}: runtimes.nvidia = {nvidia}"]),
                             "re-run deploys/runtime.py (nvidia-ctk runtime configure --runtime=docker)"))
    default = config.get("default-runtime", "runc")
    default_line = f"{DOCKER_CONFIG}: default-runtime = {default!r}" + (
        "" if "default-runtime" in config else " (not set: docker's built-in runc)")
    if settings.nvidia_runtime_default != (default == "nvidia"):
        want = "nvidia" if settings.nvidia_runtime_default else "not nvidia"
        findings.append(fail("default-runtime-wrong", f"docker's default runtime is {default!r}; the inventory "
                             f"asks for {want} (nvidia_runtime_default: {settings.nvidia_runtime_default})",
                             [default_line], "re-run deploys/runtime.py"))
    features = config.get("features") if isinstance(config.get("features"), dict) else {}
    if settings.cdi_enabled and not features.get("cdi", False):
        findings.append(fail("cdi-missing", "CDI is not enabled in docker (cdi_enabled: true)",
                             [f"{DOCKER_CONFIG}: features.cdi = {features.get('cdi')!r}"],
                             "re-run deploys/runtime.py"))
    proof = [listed, f"{DOCKER_CONFIG}: runtimes.nvidia.path = {path!r}", default_line]
    if settings.cdi_enabled:
        proof.append(f"{DOCKER_CONFIG}: features.cdi = {features.get('cdi')!r}")
    return findings, proof
