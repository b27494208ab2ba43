"""The device plugin's container image, built without a Docker engine: the same inputs give the same bytes.

Two layers, as ``plugin/Dockerfile`` describes them for users with Docker:

* base: Debian 12 ``minbase`` (what ``debian:bookworm-slim`` is made from) with
  Debian's Python (``python3-minimal``, ``libpython3.11-stdlib``), stripped as
  the slim image is (no documentation, manual pages, locales, apt lists or caches).
  Built with debootstrap (root) once per cache folder, kept as a normalised layer.
* plugin: the plugin and its dependencies installed from wheels into
  ``/usr/local/lib/python3.11/dist-packages``, byte-compiled with hash-checked
  ``.pyc`` files so a read-only root filesystem needs no writes. Constraints pin
  the dependencies (the simulator pins the versions its tests ran with).

Written by ``gpunode.image.oci``: an OCI layout (for ``skopeo``, ``ctr images import``) that is a ``docker load``
archive at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpunode.errors import GpunodeError
from gpunode.image.mirror import debian_mirror
from gpunode.image.oci import layer_tar, write_archive

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
WHEEL_PLATFORM = ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311")
ARCHIVE = "image.tar"
NAME = "gpunode-device-plugin"
Say = Callable[[str], None]


@dataclass(frozen=True)
class Recipe:
    """One of gpunode's images: the base layer, then one Python distribution and its dependencies from wheels."""

    name: str  # the image's name (its tag is the distribution's version)
    package: str  # the import package the wheel is built from
    package_dir: str  # where the package lies in the source folder ('' for plugin/, 'src' for a gpunode checkout)
    distribution: str  # the wheel file's name prefix
    entrypoint: tuple[str, ...]
    extra_files: tuple[str, ...] = ()  # files beside pyproject.toml its build reads (gpunode's readme)
    suffixes: tuple[str, ...] = (".py", ".proto")  # the package's files that go into the wheel
    # wheel platforms pip may take (Debian 12's glibc 2.36 runs manylinux_2_28 and older)
    platforms: tuple[str, ...] = ("manylinux2014_x86_64",)


PLUGIN = Recipe(NAME, "gpunode_plugin", "", "gpunode_device_plugin", ENTRYPOINT)
# The node checker: gpunode itself, judging its own node through chroot into the host's root mounted at /host.
# Root (uid 0) for chroot(2) and for reading what only root reads (the CRI socket, a 0600 containerd config);
# the DaemonSet drops every capability but SYS_CHROOT.
CHECKER = Recipe("gpunode-node-checker", "gpunode", "src", "gpunode",
                 ("/usr/bin/python3", "-m", "gpunode.cli", "node-check", "--root", "/host"), ("README.md",),
                 (".py", ".j2", ".yml"), ("manylinux_2_28_x86_64", "manylinux2014_x86_64"))  # gevent: 2_28 only


def _run(argv: Sequence[str], what: str, timeout: float = 1800) -> None:
    try:
        result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as error:
        raise GpunodeError(f"{what}: {argv[0]} is not installed", f"install {argv[0]}") from error
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-12:])
        raise GpunodeError(f"{what} failed (exit {result.returncode}):\n{tail}",
                           "read the tool's words above; the build changes nothing outside its folders")


def plugin_version(source: Path) -> str:
    """The plugin's version, from its source folder's pyproject.toml or its wheel's file name."""
    if source.is_dir():
        return str(tomllib.loads((source / "pyproject.toml").read_text())["project"]["version"])
    return source.name.split("-")[1]


def image_name(version: str, recipe: Recipe = PLUGIN) -> str:
    """The reference the DaemonSet names by default (``gpunode-device-plugin:VERSION``) as CRI spells it."""
    return f"docker.io/library/{recipe.name}:{version}"


def base_digest() -> str:
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


def base_layer(cache: Path, say: Say, mirror: str | None = None) -> Path:
    """The cached base layer (Debian slim with Python), built once per cache folder (debootstrap: root)."""
    target = cache / f"plugin-image-base-{base_digest()}.tar"
    if target.is_file():
        return target
    if os.geteuid() != 0:
        raise GpunodeError("building the image's base layer runs debootstrap, which needs root",
                           "run 'gpunode image build' as root once (later builds reuse the cached base), or "
                           "build from plugin/Dockerfile with your own image tooling")
    mirror = mirror or os.environ.get("GPUNODE_DEBIAN_MIRROR") or debian_mirror()
    say(f"building the plugin image's base: debootstrap {SUITE} minbase with {', '.join(PYTHON_PACKAGES)} "
        "(about a minute, once per cache folder)")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="plugin-base-") as work:
        root = Path(work) / "rootfs"
        _run(["debootstrap", "--variant=minbase", f"--include={','.join(PYTHON_PACKAGES)}", SUITE, str(root),
              mirror], "debootstrap of the plugin image's base")
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
                           "check that the package index is reachable and pip works in gpunode's environment")


def source_files(source: Path, recipe: Recipe = PLUGIN) -> list[Path]:
    """The source folder's files that go into its wheel (no stale build/ or egg-info)."""
    files = [source / "pyproject.toml", *(source / name for name in recipe.extra_files)]
    files += sorted(p for p in (source / recipe.package_dir / recipe.package).rglob("*")
                    if p.is_file() and p.suffix in recipe.suffixes and "__pycache__" not in p.parts)
    return files


def plugin_wheel(source: Path, work: Path, recipe: Recipe = PLUGIN) -> Path:
    """The distribution's wheel: ``source`` itself, or built from a source folder."""
    if source.is_file():
        if source.suffix != ".whl" or not zipfile.is_zipfile(source):
            raise GpunodeError(f"{source} is not a wheel", f"give the source folder of {recipe.name} or its .whl")
        return source
    if not (source / "pyproject.toml").is_file() or not (source / recipe.package_dir / recipe.package).is_dir():
        where = "/".join(part for part in (recipe.package_dir, recipe.package) if part)
        raise GpunodeError(f"{source} is not the source of {recipe.name} (no pyproject.toml and {where}/)",
                           "give the source folder (plugin/ of a gpunode checkout for the device plugin, the "
                           "checkout itself for the node checker) or its wheel")
    copy = work / "source"
    for path in source_files(source, recipe):
        target = copy / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    wheels = work / "wheels"
    _pip(["wheel", "--no-deps", "--quiet", "-w", str(wheels), str(copy)], f"building the wheel of {recipe.name}")
    return next(wheels.glob(f"{recipe.distribution}-*.whl"))


def plugin_layer(source: Path, work: Path, requirements: Sequence[str] = (), constraints: Sequence[str] = (),
                 recipe: Recipe = PLUGIN) -> bytes:
    """The distribution and its dependencies under SITE_PACKAGES, byte-compiled, as a layer."""
    wheel = plugin_wheel(source, work, recipe)
    root = work / "layer"
    site = root / SITE_PACKAGES.lstrip("/")
    pinned = work / "constraints.txt"
    pinned.write_text("".join(f"{pin}\n" for pin in constraints))
    platforms = [flag for platform in recipe.platforms for flag in ("--platform", platform)]
    _pip(["install", "--quiet", "--no-compile", "--only-binary=:all:", *platforms, *WHEEL_PLATFORM,
          "--target", str(site), "--constraint", str(pinned), str(wheel), *requirements],
         f"installing {recipe.name} and its dependencies for the image")
    # console scripts carry this machine's interpreter path, direct_url.json this machine's folders: neither is
    # the image's
    shutil.rmtree(site / "bin", ignore_errors=True)
    for leftover in site.glob("*.dist-info/direct_url.json"):
        leftover.unlink()
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text().splitlines()
        record.write_text("".join(f"{line}\n" for line in lines
                                  if not line.startswith("../") and "/direct_url.json," not in line))
    if sys.version_info[:2] == (3, 11):  # the image's Python: its .pyc files are valid there
        _run([sys.executable, "-m", "compileall", "-q", "-j0", "--invalidation-mode", "unchecked-hash",
              "-d", SITE_PACKAGES, str(site)], "byte-compiling the plugin image's Python files")
    return layer_tar(root)


def image_config(version: str, recipe: Recipe = PLUGIN) -> dict:
    return {"architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": list(recipe.entrypoint), "Env": list(ENV), "User": USER,
                       "Labels": {"org.opencontainers.image.title": recipe.name,
                                  "org.opencontainers.image.version": version}},
            "history": [{"created_by": f"debootstrap --variant=minbase {SUITE} + {' '.join(PYTHON_PACKAGES)}, slim"},
                        {"created_by": f"pip install --target {SITE_PACKAGES} {recipe.name} {version}"}]}


def build(source: Path, out: Path, cache: Path, say: Say, requirements: Sequence[str] = (),
          constraints: Sequence[str] = (), recipe: Recipe = PLUGIN) -> dict:
    """Build the image of the distribution at ``source`` (source folder or wheel) into ``out`` (``image.tar``
    and ``image.json``: name, digest, sizes); return what ``image.json`` says."""
    version = plugin_version(source)
    base = base_layer(cache, say).read_bytes()
    say(f"building the image {recipe.name} {version} (the wheel and its dependencies)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-build-") as work:
        layer = plugin_layer(source, Path(work), requirements, constraints, recipe)
        staging = Path(work) / "out"
        name = image_name(version, recipe)
        digest = write_archive(staging / ARCHIVE, [base, layer], image_config(version, recipe), [name])
        described = {"name": name, "digest": digest, "archive_bytes": (staging / ARCHIVE).stat().st_size,
                     "layers_bytes": [len(base), len(layer)]}
        (staging / "image.json").write_text(json.dumps(described, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    return described


def describe(folder: Path) -> dict:
    return json.loads((folder / "image.json").read_text())
