#!/usr/bin/python3
"""Stand-in for nvidia-container-runtime @TOOLKIT_VERSION@ in a simulated node: NVIDIA's legacy mode, not its jit-cdi.

Only the toolkit versions whose own runtime defaults to jit-cdi mode (1.18 and
later) carry this stand-in; 1.17.8's package carries NVIDIA's runtime. In jit-cdi
mode NVIDIA's runtime builds a CDI spec from NVML and mounts the driver's files
into the container itself; tried on a simulated node, it works up to the driver's
files: the simulated ``nvidia-smi`` is a Python program (not found in an image
without Python) and the simulated NVML's GPU state is not among the files it
mounts. So this stand-in does what NVIDIA's runtime does in legacy mode
(``internal/modifier/stable.go``): it adds NVIDIA's own prestart hook
(``/usr/bin/nvidia-container-runtime-hook prestart``, which reads the container's
NVIDIA_* environment and execs ``nvidia-container-cli``, the driver's stand-in)
to every container's spec, then hands the call to runc. The hook is told to skip
its mode detection (which would say jit-cdi and refuse) through a copy of the
toolkit's config.toml with ``skip-mode-detection = true``, passed by its
``-config`` flag; every other setting is the node's own.
"""

import json
import os
import re
import sys

CONFIG = "/etc/nvidia-container-runtime/config.toml"
HOOK_CONFIG = "/run/gpunode-sim/hook-config.toml"  # the node's config.toml, the hook's mode detection skipped
HOOK = "/usr/bin/nvidia-container-runtime-hook"
TABLE = "[nvidia-container-runtime-hook]"


def hook_config(text: str) -> str:
    """``text`` (config.toml) with ``skip-mode-detection = true`` in the hook's table."""
    lines = [line for line in text.splitlines() if not re.match(r"\s*skip-mode-detection\s*=", line)]
    if TABLE in (line.strip() for line in lines):
        at = next(i for i, line in enumerate(lines) if line.strip() == TABLE)
        lines.insert(at + 1, "skip-mode-detection = true")
    else:
        lines += ["", TABLE, "skip-mode-detection = true"]
    return "\n".join(lines) + "\n"


def add_hook(bundle: str) -> None:
    try:
        with open(CONFIG) as handle:
            text = handle.read()
    except FileNotFoundError:
        text = ""  # the hook's defaults, as for a node without the file
    os.makedirs(os.path.dirname(HOOK_CONFIG), exist_ok=True)
    with open(HOOK_CONFIG + ".tmp", "w") as handle:
        handle.write(hook_config(text))
    os.replace(HOOK_CONFIG + ".tmp", HOOK_CONFIG)
    path = os.path.join(bundle, "config.json")
    with open(path) as handle:
        spec = json.load(handle)
    prestart = spec.setdefault("hooks", {}).setdefault("prestart", [])
    if not any(os.path.basename(hook.get("path", "")) == os.path.basename(HOOK) for hook in prestart):
        prestart.append({"path": HOOK, "args": [os.path.basename(HOOK), f"-config={HOOK_CONFIG}", "prestart"]})
    with open(path, "w") as handle:
        json.dump(spec, handle)


def main(argv: list[str]) -> None:
    if "create" in argv:
        bundle = next((argv[i + 1] for i, a in enumerate(argv) if a in ("--bundle", "-b") and i + 1 < len(argv)),
                      os.getcwd())
        add_hook(bundle)
    os.execvp("runc", ["runc", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
