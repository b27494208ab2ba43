"""The local stand-in for NVIDIA's Container Toolkit apt repository.

Laid out like the real one (``<base>/gpgkey`` and ``<base>/stable/deb/$(ARCH)``,
a flat repository), signed with a throw-away key, holding the four toolkit
packages at each simulated version with the real inter-package dependencies.
The toolkit packages carry NVIDIA's own Go programs of their version, built from
NVIDIA's source (``gpunode_sim.build.toolkit_build``): ``nvidia-ctk``, ``nvidia-cdi-hook``,
``nvidia-container-runtime-hook`` and ``nvidia-container-runtime`` (at 1.20.0 in its default
jit-cdi mode, which mounts the driver's files itself). Stand-in: libnvidia-container
(``nvidia-container-cli``, C that talks to the kernel driver: what it does with the simulated
driver is in ``standins/nvidia_container_cli.py``), which NVIDIA's hook runs in legacy mode.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpunode_sim.build import toolkit_build
from gpunode_sim.host.hostcmd import run
from gpunode_sim.repos.packages import SimPackage, write_file
from gpunode_sim.repos.rpmrepo import RPM_ARCH, build_rpms

TOOLKIT_VERSIONS = ("1.17.8-1", "1.20.0-1")
RPM_RECIPE = "rpm repository 1: signed packages, signed repomd.xml"
REPO_PATH = "libnvidia-container"
SIGNER = "gpunode simulated NVIDIA repository <repo@gpunode.invalid>"


@dataclass(frozen=True)
class RepoInfo:
    """Where the repository lies on the host and what nodes must trust."""

    root: Path
    fingerprint: str
    arch: str

    @property
    def dist_dir(self) -> Path:
        return self.root / REPO_PATH / "stable" / "deb" / self.arch

    @property
    def rpm_dir(self) -> Path:
        """The rpm repository's ``$basearch`` folder."""

        return self.root / REPO_PATH / "stable" / "rpm" / RPM_ARCH.get(self.arch, self.arch)


def render_standin(name: str, **values: str) -> str:
    """The text of a stand-in script with its ``@NAME@`` placeholders filled in."""
    text = (resources.files("gpunode_sim") / "standins" / name).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key.upper()}@", value)
    return text


def _recipe_digest(nvidia_ctk: dict[str, Path]) -> str:
    digest = hashlib.sha256()
    digest.update(render_standin("nvidia_container_cli.py").encode())
    digest.update(repr((TOOLKIT_VERSIONS, "nvidia's runtime", RPM_RECIPE, BASE_POST_INSTALL, "lua %post")).encode())
    digest.update(toolkit_build.digest(nvidia_ctk).encode())
    return digest.hexdigest()[:16]


def _control(name: str, version: str, arch: str, depends: str, description: str) -> str:
    lines = [
        f"Package: {name}",
        f"Version: {version}",
        f"Architecture: {arch}",
        "Maintainer: gpunode simulated fleet <repo@gpunode.invalid>",
        "Section: utils",
        "Priority: optional",
    ]
    if depends:
        lines.append(f"Depends: {depends}")
    lines.append(f"Description: {description} (gpunode simulated fleet stand-in)")
    return "\n".join(lines) + "\n"


def _build_package(work: Path, out: Path, name: str, version: str, arch: str, depends: str,
                   files: dict[str, tuple[str | bytes, int]], conffiles: tuple[str, ...] = (),
                   postinst: str = "") -> None:
    root = work / f"{name}_{version}"
    for path, (text, mode) in files.items():
        write_file(root / path.lstrip("/"), text, mode)
    write_file(root / "DEBIAN" / "control", _control(name, version, arch, depends, name))
    if conffiles:
        write_file(root / "DEBIAN" / "conffiles", "\n".join(conffiles) + "\n")
    if postinst:
        write_file(root / "DEBIAN" / "postinst", postinst, 0o755)
    run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(out / f"{name}_{version}_{arch}.deb")],
        what=f"building the simulated package {name} {version}")


# As NVIDIA's packages do since 1.14 ("generate default config as post-install step"): the base package ships no
# config.toml; its post-install runs the real nvidia-ctk, which writes the defaults for the host it runs on (the
# ldconfig path among them: "@/sbin/ldconfig.real" only where that file exists, as on Ubuntu) and keeps the values
# of a config that is already there.
TOOLKIT_CONFIG = "/etc/nvidia-container-runtime/config.toml"
BASE_POST_INSTALL = ("/usr/bin/nvidia-ctk", "--quiet", "config", f"--config-file={TOOLKIT_CONFIG}", "--in-place")


def toolkit_packages(libdir: str, nvidia_ctk: dict[str, Path]) -> list[SimPackage]:
    """The four packages at each simulated version, with the real inter-package dependencies."""
    packages = []
    for version in TOOLKIT_VERSIONS:
        upstream = version.split("-")[0]
        packages += [
            SimPackage("libnvidia-container1", version, (), {
                f"{libdir}/libnvidia-container.so.{upstream}": (f"simulated libnvidia-container {upstream}\n", 0o644),
            }),
            SimPackage("libnvidia-container-tools", version,
                       (("libnvidia-container1", ">=", version), ("libnvidia-container1", "<<", "2.0.0")),
                       {"/usr/bin/nvidia-container-cli": (
                           render_standin("nvidia_container_cli.py", toolkit_version=upstream), 0o755)}),
            SimPackage("nvidia-container-toolkit-base", version, (), {
                "/usr/bin/nvidia-ctk": (nvidia_ctk[upstream].read_bytes(), 0o755),
                "/usr/bin/nvidia-cdi-hook": (
                    toolkit_build.program(nvidia_ctk[upstream], "nvidia-cdi-hook").read_bytes(), 0o755),
                "/usr/bin/nvidia-container-runtime": (
                    toolkit_build.program(nvidia_ctk[upstream], "nvidia-container-runtime").read_bytes(), 0o755),
            }, post_install=BASE_POST_INSTALL),
            SimPackage("nvidia-container-toolkit", version,
                       (("nvidia-container-toolkit-base", "=", version), ("libnvidia-container-tools", ">=", version),
                        ("libnvidia-container-tools", "<<", "2.0.0")),
                       {"/usr/bin/nvidia-container-runtime-hook": (
                           toolkit_build.program(nvidia_ctk[upstream], "nvidia-container-runtime-hook").read_bytes(),
                           0o755)}),
        ]
    return packages


def build_packages(out: Path, arch: str, nvidia_ctk: dict[str, Path]) -> None:
    with tempfile.TemporaryDirectory(prefix="gpunode-debs-") as tmp:
        work = Path(tmp)
        libdir = "/usr/lib/x86_64-linux-gnu" if arch == "amd64" else f"/usr/lib/{arch}-linux-gnu"
        for package in toolkit_packages(libdir, nvidia_ctk):
            _build_package(work, out, package.name, package.version, arch, package.deb_depends(), package.files,
                           package.conffiles, package.postinst_script())


def _make_key(gnupg: Path) -> str:
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", SIGNER, "ed25519", "sign", "never"],
        what="creating the simulated repository's signing key", env=env)
    listing = run(["gpg", "--batch", "--with-colons", "--list-keys", SIGNER], what="reading the key", env=env)
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def build_repo(root: Path, nvidia_ctk: dict[str, Path]) -> RepoInfo:
    """Build (or reuse) the signed repository under ``root``, with the real ``nvidia-ctk`` of each version."""
    arch = run(["dpkg", "--print-architecture"], what="reading the host architecture").strip()
    stamp = root / ".recipe"
    fingerprint_file = root / "fingerprint"
    recipe = _recipe_digest(nvidia_ctk)
    if stamp.exists() and stamp.read_text() == recipe and fingerprint_file.exists():
        return RepoInfo(root, fingerprint_file.read_text().strip(), arch)
    if root.exists():
        shutil.rmtree(root)
    info = RepoInfo(root, "", arch)
    dist = info.dist_dir
    dist.mkdir(parents=True)
    build_packages(dist, arch, nvidia_ctk)
    with tempfile.TemporaryDirectory(prefix="gpunode-gpg-") as gnupg_dir:
        gnupg = Path(gnupg_dir)
        gnupg.chmod(0o700)
        env = {**os.environ, "GNUPGHOME": str(gnupg)}
        try:
            fingerprint = _make_key(gnupg)
            packages = run(["apt-ftparchive", "packages", "."], what="indexing the repository", cwd=str(dist))
            (dist / "Packages").write_text(packages)
            with gzip.open(dist / "Packages.gz", "wt") as handle:
                handle.write(packages)
            release = run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=gpunode-sim",
                           "-o", "APT::FTPArchive::Release::Label=libnvidia-container", "release", "."],
                          what="writing the Release file", cwd=str(dist))
            (dist / "Release").write_text(release)
            run(["gpg", "--batch", "--yes", "--clearsign", "-o", "InRelease", "Release"],
                what="signing InRelease", env=env, cwd=str(dist))
            run(["gpg", "--batch", "--yes", "-abs", "-o", "Release.gpg", "Release"],
                what="signing Release", env=env, cwd=str(dist))

            build_rpms(info.rpm_dir, arch, toolkit_packages("/usr/lib64", nvidia_ctk), gnupg, SIGNER)
            key = run(["gpg", "--batch", "--armor", "--export", SIGNER], what="exporting the key", env=env)
            (root / REPO_PATH / "gpgkey").write_text(key)
        finally:
            run(["gpgconf", "--kill", "all"], what="stopping gpg-agent", env=env)
    fingerprint_file.write_text(fingerprint + "\n")
    stamp.write_text(recipe)
    return RepoInfo(root, fingerprint, arch)
