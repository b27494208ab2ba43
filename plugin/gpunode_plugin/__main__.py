"""Entry point the container image runs: ``gpunode-device-plugin``."""

from __future__ import annotations

import argparse
import sys

from gpunode_plugin import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpunode-device-plugin",
        description="Kubernetes device plugin for NVIDIA GPUs (not implemented yet: skeleton).",
    )
    parser.add_argument("--version", action="version", version=f"gpunode-device-plugin {__version__}")
    parser.parse_args(sys.argv[1:] if argv is None else argv)
    print("gpunode-device-plugin: the plugin is not implemented yet; see the device-plugin issue.",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
