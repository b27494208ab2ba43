"""OCI image archives written without a container engine, the same bytes for the same inputs.

Layers are uncompressed tars with sorted entries, owner root and one fixed
timestamp; configs carry no creation time. An archive holds an OCI layout (for
``ctr images import``) and a ``manifest.json`` (for ``docker load`` of docker
20.10) over the same blobs.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

EPOCH = 0  # every file's timestamp in the layers


def layer_tar(root: Path) -> bytes:
    """The folder as a layer: sorted entries, root-owned, one timestamp, hard links kept."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        paths = []
        for folder, dirs, files in os.walk(root):
            paths += [Path(folder) / name for name in dirs + files]
        for path in sorted(paths, key=lambda p: p.relative_to(root).as_posix()):
            info = tar.gettarinfo(str(path), path.relative_to(root).as_posix())
            info.mtime = EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.pax_headers = {}
            if info.isfile():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def files_layer(files: dict[str, tuple[bytes | None, int]], links: dict[str, str] | None = None) -> bytes:
    """A layer of ``{path: (content or None for a folder, mode)}`` and ``{path: symlink target}``, in path order."""
    links = links or {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted({*files, *links}):
            info = tarfile.TarInfo(name)
            if name in links:
                info.mtime, info.mode, info.type, info.linkname = EPOCH, 0o777, tarfile.SYMTYPE, links[name]
                tar.addfile(info)
                continue
            data, mode = files[name]
            info.mtime, info.mode = EPOCH, mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), EPOCH, 0o644
    tar.addfile(info, io.BytesIO(data))


def _dumps(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def write_archive(target: Path, layers: list[bytes], config: dict, names: list[str]) -> str:
    """Write the image (``config`` is the image config without ``rootfs``) under every name in ``names``.

    Returns the manifest's digest, which is the image's digest in containerd.
    """
    def blob(data: bytes) -> tuple[str, dict]:
        digest = hashlib.sha256(data).hexdigest()
        return f"blobs/sha256/{digest}", {"digest": f"sha256:{digest}", "size": len(data)}

    full = {**config, "rootfs": {"type": "layers",
                                 "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]}}
    config_bytes = _dumps(full)
    config_path, config_desc = blob(config_bytes)
    layer_entries = [blob(layer) for layer in layers]
    manifest = _dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
                       "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **desc}
                                  for _, desc in layer_entries]})
    manifest_path, manifest_desc = blob(manifest)
    index = {"schemaVersion": 2, "manifests": [
        {"mediaType": "application/vnd.oci.image.manifest.v1+json", **manifest_desc,
         "annotations": {"io.containerd.image.name": name,
                         "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]}} for name in names]}
    docker = [{"Config": config_path, "RepoTags": [name.removeprefix("docker.io/library/") for name in names],
               "Layers": [path for path, _ in layer_entries]}]
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _add(tar, "index.json", _dumps(index))
        _add(tar, "manifest.json", _dumps(docker))
        _add(tar, config_path, config_bytes)
        _add(tar, manifest_path, manifest)
        for (path, _), layer in zip(layer_entries, layers, strict=True):
            _add(tar, path, layer)
    os.replace(partial, target)
    return str(manifest_desc["digest"])


def archive_digest(archive: Path) -> str:
    """The image digest an archive written by ``write_archive`` (or any OCI layout tar) holds."""
    with tarfile.open(archive) as tar:
        for member in tar:
            if member.name in ("index.json", "./index.json"):
                handle = tar.extractfile(member)
                if handle is not None:
                    return str(json.load(handle)["manifests"][0]["digest"])
    raise ValueError(f"{archive} has no index.json")
