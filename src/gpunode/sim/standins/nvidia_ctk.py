#!/usr/bin/python3
"""Stand-in for NVIDIA's ``nvidia-ctk`` inside a simulated node.

Reproduces what the real tool writes for ``runtime configure`` at the version
baked into the package (``TOOLKIT_VERSION``): toolkit < 1.18 edits the main
config in place; 1.18 and later write a drop-in that snapshots the whole CRI
plugin table and add an ``imports`` line to the main config. Both rewrite the
files they touch with sorted keys and without comments, as the Go tool does.
The behaviour is checked against captures of the real tool (tests/fixtures/nvidia-ctk).

Stdlib only: it runs under the node's own Debian python3.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import tomllib

TOOLKIT_VERSION = "@TOOLKIT_VERSION@"
RUNTIME_BINARY = "/usr/bin/nvidia-container-runtime"
DEFAULT_DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
DEFAULT_CONFIGS = {
    "containerd": "/etc/containerd/config.toml",
    "docker": "/etc/docker/daemon.json",
    "crio": "/etc/crio/crio.conf",
}
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
BARE_RUNTIME = {
    "privileged_without_host_devices": False,
    "runtime_engine": "",
    "runtime_root": "",
    "runtime_type": "io.containerd.runc.v2",
}


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def uses_dropin() -> bool:
    return version_tuple(TOOLKIT_VERSION) >= (1, 18, 0)


def log(level: str, msg: str) -> None:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    escaped = msg.replace("\\", "\\\\").replace('"', '\\"')
    print(f'time="{now}" level={level} msg="{escaped}"', file=sys.stderr)


# --- TOML output in the layout of go-toml v1 (what nvidia-ctk writes) -------

BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_key(key: str) -> str:
    return key if BARE_KEY.match(key) else json.dumps(key)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in sorted(value.items()))
        return "{" + inner + "}"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def is_table(value: object) -> bool:
    return isinstance(value, dict)


def is_table_array(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(item, dict) for item in value)


def dump_toml(doc: dict) -> str:
    lines: list[str] = []

    def emit(table: dict, path: list[str]) -> None:
        indent = "  " * len(path)
        for key in sorted(table):
            value = table[key]
            if not is_table(value) and not is_table_array(value):
                lines.append(f"{indent}{toml_key(key)} = {toml_value(value)}")
        for key in sorted(table):
            value = table[key]
            sub = path + [key]
            header = ".".join(toml_key(part) for part in sub)
            if is_table(value):
                lines.append("")
                lines.append(f"{indent}[{header}]")
                emit(value, sub)
            elif is_table_array(value):
                for item in value:
                    lines.append("")
                    lines.append(f"{indent}[[{header}]]")
                    emit(item, sub)

    emit(doc, [])
    while lines and lines[0] == "":
        lines.pop(0)
    return "\n".join(lines) + "\n"


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nvidia-ctk-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


# --- containerd ---------------------------------------------------------------


def load_toml(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as handle:
        return tomllib.load(handle)


def ensure(table: dict, *keys: str) -> dict:
    for key in keys:
        table = table.setdefault(key, {})
    return table


def nvidia_runtime_from(runtimes: dict) -> dict:
    for name in ("runc", "crun"):
        base = runtimes.get(name)
        if isinstance(base, dict):
            runtime = json.loads(json.dumps(base))
            break
    else:
        if uses_dropin():
            log("warning", "Could not infer options from runtimes [runc crun]")
        else:
            log("warning", "could not infer options from runtimes [runc crun]; using defaults")
        runtime = dict(BARE_RUNTIME)
    runtime.setdefault("options", {})["BinaryName"] = RUNTIME_BINARY
    return runtime


def configure_cri_table(cri: dict, args: argparse.Namespace) -> None:
    containerd = ensure(cri, "containerd")
    runtimes = ensure(containerd, "runtimes")
    runtimes[args.nvidia_runtime_name] = nvidia_runtime_from(runtimes)
    if args.set_as_default:
        containerd["default_runtime_name"] = args.nvidia_runtime_name
    if args.cdi_enabled:
        cri["enable_cdi"] = True


def configure_containerd(args: argparse.Namespace) -> int:
    config_path = args.config or DEFAULT_CONFIGS["containerd"]
    try:
        config = load_toml(config_path)
    except (tomllib.TOMLDecodeError, OSError) as error:
        log("error", f"unable to load config for runtime containerd: {error}")
        return 1
    version = int(config.get("version", 2))
    config["version"] = version
    plugin = CRI_PLUGIN.get(version, CRI_PLUGIN[2])
    log("info", f"Using config version {version}")
    log("info", f'Using CRI runtime plugin name "{plugin}"')

    if not uses_dropin():
        configure_cri_table(ensure(config, "plugins", plugin), args)
        return finish_containerd(args, {config_path: dump_toml(config)}, config_path)

    snapshot = json.loads(json.dumps(config.get("plugins", {}).get(plugin, {})))
    configure_cri_table(snapshot, args)
    dropin_path = args.drop_in_config
    if dropin_path == "":
        # The real 1.18+ tool with an empty drop-in path imports the config
        # directory and writes the runtime nowhere: reproduced on purpose.
        add_import(config, os.path.join(os.path.dirname(config_path), "*.toml"))
        return finish_containerd(args, {config_path: dump_toml(config)}, config_path)

    dropin = {"version": version, "plugins": {plugin: snapshot}}
    add_import(config, os.path.join(os.path.dirname(dropin_path), "*.toml"))
    files = {dropin_path: dump_toml(dropin), config_path: dump_toml(config)}
    return finish_containerd(args, files, dropin_path)


def add_import(config: dict, pattern: str) -> None:
    imports = config.setdefault("imports", [])
    if pattern not in imports:
        imports.append(pattern)


def finish_containerd(args: argparse.Namespace, files: dict[str, str], reported: str) -> int:
    if args.dry_run:
        for path, text in files.items():
            label = "Drop-in config:" if path != (args.config or DEFAULT_CONFIGS["containerd"]) else "Top-level config:"
            log("info", label if len(files) > 1 else "Config:")
            print(text)
        return 0
    for path, text in files.items():
        write_atomic(path, text)
    log("info", f"Wrote updated config to {reported}")
    log("info", "It is recommended that containerd daemon be restarted.")
    return 0


# --- docker ---------------------------------------------------------------------


def configure_docker(args: argparse.Namespace) -> int:
    path = args.config or DEFAULT_CONFIGS["docker"]
    if os.path.exists(path):
        log("info", f"Loading config from {path}")
        try:
            with open(path) as handle:
                text = handle.read()
            if not text.strip():
                raise ValueError("EOF")
            config = json.loads(text)
        except (ValueError, OSError) as error:
            message = "EOF" if str(error) == "EOF" else str(error)
            log("error", f"unable to load config for runtime docker: {message}")
            return 1
    else:
        log("info", "Config file does not exist; using empty config")
        config = {}
    config.setdefault("runtimes", {})[args.nvidia_runtime_name] = {
        "args": [],
        "path": "nvidia-container-runtime",
    }
    if args.set_as_default:
        config["default-runtime"] = args.nvidia_runtime_name
    if args.cdi_enabled:
        config.setdefault("features", {})["cdi"] = True
    text = json.dumps(config, indent=4, sort_keys=True)
    if args.dry_run:
        print(text)
        return 0
    write_atomic(path, text)
    log("info", f"Wrote updated config to {path}")
    log("info", "It is recommended that docker daemon be restarted.")
    return 0


# --- command line -----------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="nvidia-ctk", add_help=True)
    parser.add_argument("--version", action="store_true")
    sub = parser.add_subparsers(dest="command")
    runtime = sub.add_parser("runtime")
    runtime_sub = runtime.add_subparsers(dest="action")
    configure = runtime_sub.add_parser("configure")
    configure.add_argument("--runtime", default="docker")
    configure.add_argument("--config")
    configure.add_argument("--drop-in-config", dest="drop_in_config", default=DEFAULT_DROPIN)
    configure.add_argument("--set-as-default", action="store_true")
    configure.add_argument("--cdi.enabled", dest="cdi_enabled", action="store_true")
    configure.add_argument("--dry-run", action="store_true")
    configure.add_argument("--nvidia-runtime-name", default="nvidia")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.version:
        print(f"NVIDIA Container Toolkit CLI version {TOOLKIT_VERSION}")
        return 0
    if args.command != "runtime" or args.action != "configure":
        print("nvidia-ctk (simulated): only 'runtime configure' and '--version' exist here", file=sys.stderr)
        return 1
    if args.runtime == "containerd":
        return configure_containerd(args)
    if args.runtime == "docker":
        return configure_docker(args)
    log("error", f"unrecognized runtime '{args.runtime}'")
    return 1


if __name__ == "__main__":
    sys.exit(main())
