"""The device plugin's container image, built here without a Docker engine, as the nodes run it.

Two layers, as ``plugin/Dockerfile`` describes them for users with Docker:

* base: Debian 12 ``minbase`` (what ``debian:bookworm-slim`` is made from) with
  Debian's Python (``python3-minimal``, ``libpython3.11-stdlib``), stripped as
  the slim image is (no documentation, manual pages, locales, apt lists or caches).
  Built once per machine with debootstrap and cached as a normalised layer.
* plugin: the plugin and its pinned dependencies (the versions the tests ran
  with) installed from wheels into ``/usr/local/lib/python3.11/dist-packages``,
  byte-compiled with hash-checked ``.pyc`` files so a read-only root filesystem
  needs no writes.

Written by ``gpunode_sim.images.oci``: the same inputs give the same image digest.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode_sim.host.hostcmd import run
from gpunode_sim.host.mirror import debian_mirror
from gpunode_sim.images.oci import layer_tar, write_archive

SUITE = "bookworm"
BASE_IMAGE = "debian:bookworm-slim"  # what plugin/Dockerfile starts FROM; debootstrap minbase is its recipe
PYTHON_PACKAGES = ("python3-minimal", "libpython3.11-stdlib")
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
ENTRYPOINT = ("/usr/bin/python3", "-m", "gpunode_plugin")
ENV = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "PYTHONDONTWRITEBYTECODE=1",
       "PYTHONUNBUFFERED=1")
# The kubelet's device-plugins folder is root's (0750 on kubeadm nodes): the plugin must create its socket
# there and dial kubelet.sock, so it runs as root, with every capability dropped by the DaemonSet.
USER = "0:0"
SLIM_REMOVE = ("usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
               "usr/share/linda", "var/lib/apt/lists", "var/cache/apt", "var/cache/debconf", "var/cache/ldconfig",
               "var/log", "var/lib/dpkg/info/*.md5sums", "etc/machine-id", "etc/hostname", "etc/resolv.conf",
               "etc/hosts")
SLIM_KEEP = ("usr/share/doc/*/copyright",)
DEPENDENCIES = ("grpcio", "protobuf", "nvidia-ml-py", "pyyaml")  # plugin/pyproject.toml's, pinned when built
WHEEL_PLATFORM = ("--platform", "manylinux2014_x86_64", "--python-version", "3.11", "--implementation", "cp",
                  "--abi", "cp311")
ARCHIVE = "image.tar"
Say = Callable[[str], None]


def plugin_dir() -> Path:
    """plugin/ of this checkout (beside src/)."""
    return Path(__file__).resolve().parents[3] / "plugin"


def plugin_version(source: Path) -> str:
    return str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"])


def image_name(source: Path | None = None) -> str:
    """The reference the DaemonSet names (``gpunode-device-plugin:VERSION``) as CRI spells it in full."""
    return f"docker.io/library/gpunode-device-plugin:{plugin_version(source or plugin_dir())}"


def pinned_dependencies() -> list[str]:
    """The plugin's dependencies at the versions installed here, so the image runs what the tests ran."""
    pins = []
    for name in DEPENDENCIES:
        try:
            pins.append(f"{name}=={metadata.version(name)}")
        except metadata.PackageNotFoundError as error:
            raise GpunodeError(f"{name} is not installed in gpunode's environment (the plugin image pins it)",
                               "pip install -e '.[sim]' (scripts/setup-host does)") from error
    return pins


def installed_versions() -> list[str]:
    """``name==version`` of every distribution in gpunode's environment but gpunode's own."""
    pins = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name and name not in ("gpunode", "gpunode-device-plugin"):
            pins[name] = f"{name}=={dist.version}"
    return sorted(pins.values())


def _source_files(source: Path) -> list[Path]:
    files = [source / "pyproject.toml"]
    files += sorted(p for p in (source / "gpunode_plugin").rglob("*")
                    if p.is_file() and p.suffix in (".py", ".proto") and "__pycache__" not in p.parts)
    return files


@functools.cache  # one per process: 'sim up' asks once for the fleet and once per node
def _inputs_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for item in (SUITE, PYTHON_PACKAGES, SLIM_REMOVE, ENTRYPOINT, ENV, USER, installed_versions(),
                 sys.version_info[:2]):
        digest.update(repr(item).encode())
    for path in _source_files(source):
        digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def _base_digest() -> str:
    return hashlib.sha256(repr((SUITE, PYTHON_PACKAGES, SLIM_REMOVE, SLIM_KEEP)).encode()).hexdigest()[:12]


def _slim(root: Path) -> None:
    keep = {p: p.read_bytes() for pattern in SLIM_KEEP for p in root.glob(pattern)}
    for pattern in SLIM_REMOVE:
        for path in root.glob(pattern):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
    for path, data in keep.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for folder in ("var/log", "var/cache/apt", "var/lib/apt/lists"):
        (root / folder).mkdir(parents=True, exist_ok=True)


def base_layer(cache: Path, say: Say) -> Path:
    """The cached base layer (Debian slim with Python), built once per machine."""
    target = cache / f"plugin-image-base-{_base_digest()}.tar"
    if target.is_file():
        return target
    mirror = os.environ.get("GPUNODE_DEBIAN_MIRROR") or debian_mirror()
    say(f"building the plugin image's base: debootstrap {SUITE} minbase with {', '.join(PYTHON_PACKAGES)} "
        "(about a minute, once per machine)")
    with tempfile.TemporaryDirectory(dir=cache, prefix="plugin-base-") as work:
        root = Path(work) / "rootfs"
        run(["debootstrap", "--variant=minbase", f"--include={','.join(PYTHON_PACKAGES)}", SUITE, str(root), mirror],
            what="debootstrap of the plugin image's base", timeout=1800)
        _slim(root)
        partial = target.with_suffix(".partial")
        partial.write_bytes(layer_tar(root))
        os.replace(partial, target)
    return target


def _pip(args: list[str], what: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpunodeError(f"{what} failed (pip exit {result.returncode}): {result.stderr.strip()[-600:]}",
                           "check that the package registry is reachable and pip works in gpunode's environment")


def plugin_layer(source: Path, work: Path) -> bytes:
    """The plugin and its pinned dependencies under SITE_PACKAGES, byte-compiled, as a layer."""
    copy = work / "plugin-source"
    for path in _source_files(source):  # only tracked kinds of files: no stale build/ or egg-info
        target = copy / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    wheels = work / "wheels"
    _pip(["wheel", "--no-deps", "--quiet", "-w", str(wheels), str(copy)],
         "building the plugin's wheel")
    wheel = next(wheels.glob("gpunode_device_plugin-*.whl"))
    root = work / "layer"
    site = root / SITE_PACKAGES.lstrip("/")
    constraints = work / "constraints.txt"  # what they need in turn, at the versions installed here too
    constraints.write_text("".join(f"{pin}\n" for pin in installed_versions()))
    _pip(["install", "--quiet", "--no-compile", "--only-binary=:all:", *WHEEL_PLATFORM, "--target", str(site),
          "--constraint", str(constraints), str(wheel), *pinned_dependencies()],
         "installing the plugin and its dependencies for the image")
    # console scripts carry this machine's interpreter path, direct_url.json this checkout's: neither is the image's
    shutil.rmtree(site / "bin", ignore_errors=True)
    for leftover in site.glob("*.dist-info/direct_url.json"):
        leftover.unlink()
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text().splitlines()
        record.write_text("".join(f"{line}\n" for line in lines
                                  if not line.startswith("../") and "/direct_url.json," not in line))
    if sys.version_info[:2] == (3, 11):  # the image's Python: its .pyc files are valid there
        run([sys.executable, "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
             "-d", SITE_PACKAGES, str(site)], what="byte-compiling the plugin image's Python files")
    return layer_tar(root)


def image_config(version: str) -> dict:
    return {"architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": list(ENTRYPOINT), "Env": list(ENV), "User": USER,
                       "Labels": {"org.opencontainers.image.title": "gpunode-device-plugin",
                                  "org.opencontainers.image.version": version}},
            "history": [{"created_by": f"debootstrap --variant=minbase {SUITE} + {' '.join(PYTHON_PACKAGES)}, slim"},
                        {"created_by": f"pip install --target {SITE_PACKAGES} gpunode-device-plugin {version}"}]}


def built(cache: Path, source: Path | None = None) -> Path | None:
    """The folder of the image for this plugin source, when it is built."""
    source = source or plugin_dir()
    folder = cache / f"plugin-image-{_inputs_digest(source)}"
    return folder if (folder / "image.json").is_file() else None


def require(cache: Path) -> Path:
    """The built image of this checkout's plugin, or a clear error saying how to build it."""
    folder = built(cache)
    if folder is None:
        raise GpunodeError(f"the device plugin image of {plugin_dir()} is not built in {cache}",
                           "run 'gpunode sim build' (it builds it in seconds once the base layer is cached)")
    return folder


def ensure_built(cache: Path, say: Say, source: Path | None = None) -> Path:
    """Build the plugin image unless this plugin source's image is cached; return its folder.

    The folder holds ``image.tar`` and ``image.json`` (name, digest, size).
    """
    source = source or plugin_dir()
    if not (source / "pyproject.toml").is_file():
        raise GpunodeError(f"the plugin's source is not at {source}",
                           "run from a gpunode checkout (plugin/ beside src/)")
    folder = cache / f"plugin-image-{_inputs_digest(source)}"
    if (folder / "image.json").is_file():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    base = base_layer(cache, say).read_bytes()
    say("building the device plugin image (plugin wheel and pinned dependencies)")
    with tempfile.TemporaryDirectory(dir=cache, prefix="plugin-image-build-") as work:
        layer = plugin_layer(source, Path(work))
        staging = Path(work) / "out"
        name, version = image_name(source), plugin_version(source)
        digest = write_archive(staging / ARCHIVE, [base, layer], image_config(version), [name])
        (staging / "image.json").write_text(json.dumps({
            "name": name, "digest": digest, "archive_bytes": (staging / ARCHIVE).stat().st_size,
            "layers_bytes": [len(base), len(layer)]}, indent=2) + "\n")
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    say(f"plugin image {image_name(source)} built: {folder / ARCHIVE}")
    return folder


def describe(folder: Path) -> dict:
    return json.loads((folder / "image.json").read_text())
