"""The local stand-in for NVIDIA's Container Toolkit rpm repository (``<base>/stable/rpm/$basearch``).

The same four packages as the apt repository, with the same files (the real
``nvidia-ctk``) and the same inter-package dependencies in rpm's terms, built
with the real ``rpmbuild``, signed with the repository's key by the real
``rpmsign``, indexed by ``createrepo_c`` and with ``repomd.xml`` signed, so that
dnf checks packages (gpgcheck) and metadata (repo_gpgcheck) as it would against
NVIDIA's.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from gpunode_sim.host.hostcmd import run
from gpunode_sim.repos.packages import SimPackage, write_file

RPM_ARCH = {"amd64": "x86_64", "arm64": "aarch64"}
RPM_OPERATORS = {">=": ">=", "<<": "<", "=": "=", "<=": "<=", ">>": ">"}


def spec(package: SimPackage, arch: str, stage: Path) -> str:
    """An rpm spec that packs the staged files as they are: no automatic dependencies, no stripping."""
    upstream, release = package.version.split("-", 1)
    requires = [f"Requires: {name} {RPM_OPERATORS[op]} {version}" for name, op, version in package.depends]
    files = [f"%config(noreplace) {path}" if path in package.conffiles else path for path in sorted(package.files)]
    return "\n".join([
        f"Name: {package.name}", f"Version: {upstream}", f"Release: {release}",
        f"Summary: {package.name} (gpunode simulated fleet stand-in)", "License: Apache-2.0",
        f"BuildArch: {arch}", "AutoReqProv: no", *requires, "",
        "%description", f"{package.name} as the gpunode simulated fleet's NVIDIA repository carries it.", "",
        "%install", f"cp -a {stage}/. %{{buildroot}}/", "",
        *(["%post -p <lua>", package.rpm_post_lua(), ""] if package.post_install else []),
        "%files", *files, "",
    ])


def build_rpms(out: Path, arch: str, packages: list[SimPackage], gnupg: Path, signer: str) -> None:
    """Build, sign and index ``packages`` in ``out`` (the repository's ``$basearch`` folder)."""
    rpm_arch = RPM_ARCH.get(arch, arch)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpunode-rpms-") as tmp:
        work = Path(tmp)
        for package in packages:
            stage = work / f"stage-{package.name}-{package.version}"
            for path, (content, mode) in package.files.items():
                write_file(stage / path.lstrip("/"), content, mode)
            spec_file = work / f"{package.name}-{package.version}.spec"
            spec_file.write_text(spec(package, rpm_arch, stage))
            run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {work / 'top'}", "--define", f"_rpmdir {out}",
                 "--define", "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm",
                 "--define", "__os_install_post %{nil}", "--define", "debug_package %{nil}",
                 "--define", "_build_id_links none", str(spec_file)],
                what=f"building the simulated rpm {package.name} {package.version}")
    rpms = sorted(str(p) for p in out.glob("*.rpm"))
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    gpg = shutil.which("gpg") or "/usr/bin/gpg"  # Debian's rpm looks for gpg2 by default
    run(["rpmsign", "--addsign", "--define", f"_gpg_name {signer}", "--define", f"_gpg_path {gnupg}",
         "--define", f"__gpg {gpg}", *rpms],
        what="signing the simulated rpms", env=env)
    run(["createrepo_c", "--quiet", str(out)], what="indexing the rpm repository")
    run(["gpg", "--batch", "--yes", "--armor", "--detach-sign", "-o", str(out / "repodata/repomd.xml.asc"),
         str(out / "repodata/repomd.xml")], what="signing repomd.xml", env=env)
