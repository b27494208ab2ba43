"""Diagnosis of the toolkit step: all four packages at the pinned version (and held, if asked); apt or dnf; and
the installed toolkit able to work on this host (its config.toml's ldconfig exists here, its programs executable,
a CDI spec where its mode is cdi)."""

from __future__ import annotations

from gpunode.diagnosis import Finding, Verdict, with_proof
from gpunode.facts.toolkit import CDI_DIRS, VOLUME_MOUNTS_KEY
from gpunode.settings import TOOLKIT_CONFIG, VERSIONLOCK_LIST, NodeSettings, version_key

STEP = "toolkit"


def ldconfig_choice(paths: dict[str, bool]) -> str | None:
    """The ldconfig nvidia-ctk itself picks on this host ("@/sbin/ldconfig.real" where that exists, as on Ubuntu,
    else "@/sbin/ldconfig"), or None when neither exists."""
    for path in ("/sbin/ldconfig.real", "/sbin/ldconfig"):
        if paths.get(path):
            return "@" + path
    return None


NORMALIZED_SINCE = (1, 15)  # NVIDIA's hook resolves "@X.real" / "@X" to whichever of the two exists (v1.15.0-rc.1)


def hook_ldconfig(value: str, paths: dict[str, bool], versions: dict[str, str]) -> str:
    """The host ldconfig NVIDIA's hook passes to nvidia-container-cli for a configured ``@path``: since toolkit 1.15
    the hook trims a ``.real`` suffix, then takes ``<path>.real`` where that exists on the host, else ``<path>``
    (so Ubuntu's "@/sbin/ldconfig.real" works on Debian); older hooks pass the value as it is."""
    installed = next((v for v in (versions.get("nvidia-container-toolkit"), *versions.values()) if v), "")
    numbers = version_key(str(installed))[:2]
    if len(numbers) < 2 or numbers < NORMALIZED_SINCE:
        return value
    trimmed = value[1:].removesuffix(".real")
    return "@" + (trimmed + ".real" if paths.get(trimmed + ".real") else trimmed)


def config_findings(state: dict) -> list[Finding]:
    """What config.toml asks that this host cannot do: every GPU container fails at its creation."""
    config = state.get("config")
    if not config:
        return []
    if config["error"]:
        return [Finding(STEP, Verdict.FINDING, f"{TOOLKIT_CONFIG} does not parse: the NVIDIA runtime refuses to start "
                        "any container", [f"{TOOLKIT_CONFIG}: {config['error']}"],
                        f"correct the TOML at the place named, or move the file away and run 'nvidia-ctk config "
                        f"--in-place --config-file={TOOLKIT_CONFIG}' to write the defaults",
                        code="toolkit-config-invalid")]
    value = config["ldconfig"]
    if value is None:
        return []
    choice = ldconfig_choice(state["paths"])
    fix = (f"nvidia-ctk config --in-place --config-file={TOOLKIT_CONFIG} --set nvidia-container-cli.ldconfig={choice} "
           "(re-running deploys/toolkit.py does this)" if choice else
           "install the C library's ldconfig (it is missing from /sbin on this host)")
    where = f'{TOOLKIT_CONFIG}: [nvidia-container-cli] ldconfig = "{value}"'
    if not value.startswith("@"):
        return [Finding(STEP, Verdict.FINDING, "the toolkit's ldconfig is not a host path (no leading '@'): toolkit "
                        "1.17.3 and later refuse the config and every GPU container fails",
                        [where, f"error loading config: nvidia-container-cli.ldconfig value \"{value}\" is not "
                                "host-relative (does not start with a '@')"], fix,
                        code="toolkit-ldconfig-in-container")]
    used = hook_ldconfig(value, state["paths"], state.get("versions") or {})
    if not state["paths"].get(used[1:]):
        present = [path for path, exists in sorted(state["paths"].items()) if exists]
        return [Finding(STEP, Verdict.FINDING, f"the toolkit's ldconfig {used[1:]} does not exist on this host: every "
                        "GPU container fails with 'nvidia-container-cli: ldcache error: open failed: "
                        f"{used[1:]}: no such file or directory'",
                        [where] + ([f"NVIDIA's hook resolves it to {used}"] if used != value else []) + [
                         f"test -e {used[1:]}: no such file", f"ldconfig on this host: {', '.join(present) or 'none'}"],
                        fix, code="toolkit-ldconfig-missing")]
    return []


VOLUME_MOUNTS_FIX = (f"nvidia-ctk config --in-place --config-file={TOOLKIT_CONFIG} --set {VOLUME_MOUNTS_KEY}=true "
                     "(re-running deploys/toolkit.py does this)")


def volume_mount_findings(state: dict, settings: NodeSettings) -> list[Finding]:
    """The device plugin's volume-mounts strategy needs the hook to take devices from mounts; off (the default),
    the hook passes NVIDIA_VISIBLE_DEVICES as it is, the mount root, which is no device."""
    config = state.get("config")
    if settings.plugin_device_list_strategy != "volume-mounts" or (config or {}).get("volume_mounts"):
        return []
    said = (f"{TOOLKIT_CONFIG}: {VOLUME_MOUNTS_KEY} is not true (false by default)" if config else
            f"{TOOLKIT_CONFIG}: absent ({VOLUME_MOUNTS_KEY} is false by default)")
    return [Finding(STEP, Verdict.FINDING, "the device plugin hands GPUs as volume mounts (plugin_device_list_strategy "
                    "volume-mounts) but the toolkit does not take devices from mounts: every GPU container fails "
                    "with 'nvidia-container-cli: device error: /var/run/nvidia-container-devices: unknown device'",
                    [said, f"inventory: plugin_device_list_strategy = {settings.plugin_device_list_strategy}"],
                    VOLUME_MOUNTS_FIX,
                    code="toolkit-volume-mounts-refused")]


def not_executable(state: dict) -> dict[str, str]:
    """The toolkit programs without any execute bit, with their modes as stat printed them."""
    return {path: mode for path, mode in sorted(state.get("modes", {}).items()) if not int(mode[-3:], 8) & 0o111}


def program_findings(state: dict) -> list[Finding]:
    """A toolkit program without any execute bit: containerd's exec of it fails with 'permission denied'."""
    stuck = not_executable(state)
    if not stuck:
        return []
    return [Finding(STEP, Verdict.FINDING, f"toolkit program(s) not executable: {', '.join(stuck)}; the container "
                    "runtime's exec of them fails with 'permission denied'",
                    [f"stat -c %a {path}: {mode}" for path, mode in stuck.items()],
                    f"chmod 0755 {' '.join(stuck)} (as the packages install them; re-running deploys/toolkit.py "
                    "does this)", code="toolkit-not-executable")]


CDI_FIX = "nvidia-ctk cdi generate --output={path} (again after every driver or GPU change)"


def cdi_findings(state: dict, settings: NodeSettings) -> list[Finding]:
    """Where CDI is used (the NVIDIA runtime in cdi mode, CDI enabled in the container runtime, or the device plugin
    naming CDI devices: the cdi-cri and cdi-annotations strategies), a spec must
    name this node's GPUs: one that does not parse fails every CDI device, one written on another node or before a
    GPU was replaced names GPUs that are not here (a container asking for them fails with 'unresolvable CDI
    devices') and lacks the ones that are."""
    config = state.get("config") or {}
    in_cdi_mode = config.get("mode") == "cdi"
    strategy = settings.plugin_device_list_strategy
    names_cdi = strategy.startswith("cdi-")  # the plugin names nvidia.com/gpu devices: the node's spec defines them
    if not (in_cdi_mode or settings.cdi_enabled or names_cdi):
        return []
    specs = state.get("cdi_specs") or []
    if not specs:
        if not (in_cdi_mode or names_cdi):
            return []  # CDI enabled without a spec: the device plugin's envvar strategy needs none
        who = ("the NVIDIA runtime is in cdi mode" if in_cdi_mode else
               f"the device plugin names GPUs as CDI devices (plugin_device_list_strategy = {strategy})")
        said = (f'{TOOLKIT_CONFIG}: [nvidia-container-runtime] mode = "{config["mode"]}"' if in_cdi_mode else
                f"inventory: plugin_device_list_strategy = {strategy}")
        return [Finding(STEP, Verdict.FINDING, f"{who} but no CDI spec names nvidia.com/gpu devices: GPU containers "
                        "fail with 'unresolvable CDI devices'",
                        [said, f"CDI specs naming nvidia.com/gpu in {', '.join(CDI_DIRS)}: 0"],
                        CDI_FIX.format(path="/etc/cdi/nvidia.yaml"), code="toolkit-cdi-spec-missing")]
    findings = []
    for path, error in sorted((state.get("cdi_errors") or {}).items()):
        findings.append(Finding(STEP, Verdict.FINDING,
                                f"the CDI spec {path} does not parse as a spec of nvidia.com/gpu "
                                "devices: the runtime refuses its devices", [f"{path}: {error}"],
                                CDI_FIX.format(path=path), code="toolkit-cdi-spec-invalid"))
    gpus = state.get("cdi_gpus") or []
    if not gpus:
        return findings  # nvidia-smi listed no GPU: the driver step says why
    names = {name for devices in (state.get("cdi_devices") or {}).values() for name in devices}
    here = {gpu["uuid"] for gpu in gpus}
    missing = [gpu for gpu in gpus if gpu["uuid"] not in names and str(gpu["index"]) not in names]
    foreign = sorted(name for name in names if name.startswith("GPU-") and name not in here)
    if missing or foreign:
        evidence = ["nvidia-smi --query-gpu=index,uuid: " + ", ".join(f"{g['index']} {g['uuid']}" for g in gpus)]
        evidence += [f"{path}: devices {', '.join(devices) or 'none'}"
                     for path, devices in sorted((state.get("cdi_devices") or {}).items())]
        parts = ([f"no device for GPU(s) {', '.join(g['uuid'] for g in missing)}"] if missing else []) + (
            [f"devices for GPU(s) this node does not have: {', '.join(foreign)}"] if foreign else [])
        findings.append(Finding(STEP, Verdict.FINDING, "the CDI spec does not match the GPUs nvidia-smi sees ("
                                + "; ".join(parts) + "): it was written on another node or before a GPU or driver "
                                "change, and containers asking for those devices fail with 'unresolvable CDI "
                                "devices'", evidence,
                                CDI_FIX.format(path=specs[0]) + "; re-running deploys/toolkit.py does this",
                                code="toolkit-cdi-spec-stale"))
    return findings


def host_evidence(state: dict) -> list[str]:
    """What the installed toolkit reads on this host, for the proof."""
    config = state.get("config")
    if config is None:
        lines = [f"{TOOLKIT_CONFIG}: absent (the runtime uses nvidia-ctk's defaults for this host)"]
    else:
        value = config.get("ldconfig")
        used = hook_ldconfig(value, state.get("paths") or {}, state.get("versions") or {}) if value else ""
        lines = [(f'{TOOLKIT_CONFIG}: ldconfig = "{value}" ({used[1:]} exists'
                  + (f", the path NVIDIA's hook uses for {value})" if used != value else ")")) if value else
                 f"{TOOLKIT_CONFIG}: no ldconfig set (the default for this host)"]
        if config.get("mode"):
            lines.append(f'{TOOLKIT_CONFIG}: mode = "{config["mode"]}"'
                         + (f" ({len(state['cdi_specs'])} CDI spec(s): {', '.join(state['cdi_specs'])})"
                            if config["mode"] == "cdi" else ""))
    gpus = state.get("cdi_gpus") or []
    for path, devices in sorted((state.get("cdi_devices") or {}).items()):
        named = [gpu["uuid"] for gpu in gpus if gpu["uuid"] in devices]
        lines.append(f"{path}: {len(devices)} nvidia.com/gpu device(s)"
                     + (f", naming {len(named)} of the {len(gpus)} GPU(s) nvidia-smi lists by UUID" if gpus else ""))
    return lines + [f"stat -c %a {path}: {mode}" for path, mode in sorted(state.get("modes", {}).items())]


def diagnose(state: dict, settings: NodeSettings) -> list[Finding]:
    want = settings.toolkit_version
    rpm = state["family"] == "rpm"
    wrong = {name: version for name, version in state["versions"].items() if version != want}
    findings = []
    if wrong:
        evidence = [f"{name}: {version or 'not installed'}" for name, version in sorted(wrong.items())]
        what = ("the NVIDIA Container Toolkit is not installed" if all(v is None for v in state["versions"].values())
                else f"toolkit packages are not all at the pinned {want}")
        findings.append(Finding(STEP, Verdict.FINDING, what, evidence,
                                f"re-run deploys/toolkit.py (installs all four at {want})"))
    locks = state["locks"]
    if rpm and locks and any(version != want for version in locks.values()):
        findings.append(Finding(STEP, Verdict.FINDING, f"dnf versionlock holds toolkit packages at another version "
                                f"than the pinned {want}: dnf will not move them",
                                [f"{VERSIONLOCK_LIST}: {name} locked at {version}" for name, version in
                                 sorted(locks.items()) if version != want],
                                "re-run deploys/toolkit.py (it moves the locks with the pin)"))
    elif settings.toolkit_hold and not wrong:
        unheld = sorted(set(state["versions"]) - set(state["held"]))
        if unheld:
            findings.append(Finding(STEP, Verdict.FINDING, "toolkit packages are not held at the pinned version",
                                    [f"not held: {', '.join(unheld)}"]
                                    + ([f"{VERSIONLOCK_LIST}: no lock for them"] if rpm else []),
                                    f"{'dnf versionlock add' if rpm else 'apt-mark hold'} {' '.join(unheld)} "
                                    "(or re-run deploys/toolkit.py)"))
    if not wrong:  # what the installed toolkit needs from this host (a missing package is the finding above)
        findings += (config_findings(state) + volume_mount_findings(state, settings) + program_findings(state)
                     + cdi_findings(state, settings))
    source = "rpm -q" if rpm else "dpkg-query"
    held = "locked by dnf versionlock" if rpm else "held"
    evidence = [f"{source}: {name} {version}" + (f" ({held})" if name in state["held"] else " (not held)")
                for name, version in sorted(state["versions"].items())]
    return with_proof(findings, STEP, f"the toolkit packages are at the pinned {want}"
                      + (" and held" if settings.toolkit_hold else "") + ", and this host can run what its config "
                      "asks", evidence + host_evidence(state))
