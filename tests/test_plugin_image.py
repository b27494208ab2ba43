"""The device plugin's image as gpunode builds it without Docker, and plugin/Dockerfile describing the same."""

from __future__ import annotations

import io
import json
import re
import shlex
import tarfile
from pathlib import Path

import pytest
from gpunode_sim.images import plugin_image

from gpunode.image.oci import write_archive

from .conftest import REPO

CACHE = Path("/var/cache/gpunode")


def final_stage(dockerfile: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of the Dockerfile's last stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", "\n".join(line for line in dockerfile.splitlines()
                                              if not line.lstrip().startswith("#")))
    stages: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        if not line.strip():
            continue
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), rest.strip()))
    return stages[-1]


def test_the_dockerfile_describes_the_image_gpunode_builds() -> None:
    stage = final_stage((REPO / "plugin" / "Dockerfile").read_text())
    values = {}
    for word, rest in stage:
        values.setdefault(word, []).append(rest)
    assert values["FROM"] == [plugin_image.BASE_IMAGE]
    installed = re.search(r"apt-get install -y --no-install-recommends ([^&]+)", values["RUN"][0])
    assert installed and installed.group(1).split() == list(plugin_image.PYTHON_PACKAGES)
    assert values["COPY"] == [f"--from=build {plugin_image.SITE_PACKAGES} {plugin_image.SITE_PACKAGES}"]
    env = set(shlex.split(values["ENV"][0]))
    assert env == {e for e in plugin_image.ENV if not e.startswith("PATH=")}  # PATH: debian:bookworm-slim's own
    assert values["USER"] == [plugin_image.USER]
    assert json.loads(values["ENTRYPOINT"][0]) == list(plugin_image.ENTRYPOINT)


def test_the_dockerfile_reader_sees_a_different_entrypoint() -> None:
    changed = (REPO / "plugin" / "Dockerfile").read_text().replace('"-m", "gpunode_plugin"', '"-m", "other"')
    entrypoints = [rest for word, rest in final_stage(changed) if word == "ENTRYPOINT"]
    assert json.loads(entrypoints[0]) != list(plugin_image.ENTRYPOINT)


@pytest.fixture(scope="module")
def built() -> Path:
    if not any(CACHE.glob("plugin-image-base-*.tar")):
        pytest.skip("the plugin image's base layer is not cached (run scripts/setup-host)")
    return plugin_image.ensure_built(CACHE, lambda _: None)


def members(layer: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_the_built_image_holds_the_plugin_on_debian_python_and_no_documentation(built: Path) -> None:
    with tarfile.open(built / plugin_image.ARCHIVE) as archive:
        index = json.load(archive.extractfile("index.json"))
        manifest_digest = index["manifests"][0]["digest"]
        manifest = json.load(archive.extractfile(f"blobs/sha256/{manifest_digest.split(':')[1]}"))
        config = json.load(archive.extractfile(f"blobs/sha256/{manifest['config']['digest'].split(':')[1]}"))
        layers = [archive.extractfile(f"blobs/sha256/{layer['digest'].split(':')[1]}").read()
                  for layer in manifest["layers"]]
        docker = json.load(archive.extractfile("manifest.json"))
    assert index["manifests"][0]["annotations"]["io.containerd.image.name"] == plugin_image.image_name()
    assert docker[0]["RepoTags"] == ["gpunode-device-plugin:0.1.0"]
    assert config["config"]["Entrypoint"] == list(plugin_image.ENTRYPOINT)
    assert config["config"]["User"] == plugin_image.USER and "created" not in config
    base, plugin = (members(layer) for layer in layers)
    assert "usr/bin/python3.11" in base and "usr/lib/python3.11/json/__init__.py" in base
    assert not [n for n in base if n.startswith("usr/share/doc/") and not n.endswith(("/copyright", "doc"))
                and base[n].isfile()]
    assert not [n for n in base if n.startswith(("usr/share/man/", "usr/share/locale/", "var/lib/apt/lists/"))]
    site = plugin_image.SITE_PACKAGES.lstrip("/")
    for module in ("gpunode_plugin/__main__.py", "grpc/__init__.py", "pynvml.py", "yaml/__init__.py",
                   "typing_extensions.py"):
        assert f"{site}/{module}" in plugin, module
    assert any(n.startswith(f"{site}/gpunode_plugin/__pycache__/") and n.endswith(".pyc") for n in plugin)
    assert not [n for n in plugin if n.endswith("direct_url.json") or f"{site}/bin/" in n]
    assert {m.mtime for m in plugin.values()} == {0} and {m.uid for m in plugin.values()} == {0}
    described = plugin_image.describe(built)
    assert described["digest"] == manifest_digest


def test_the_same_inputs_give_the_same_image(built: Path, tmp_path: Path) -> None:
    base = next(CACHE.glob(f"plugin-image-base-{plugin_image._base_digest()}.tar")).read_bytes()
    digests = set()
    for attempt in ("one", "two"):
        work = tmp_path / attempt
        work.mkdir()
        layer = plugin_image.plugin_layer(plugin_image.plugin_dir(), work)
        digests.add(write_archive(work / "image.tar", [base, layer],
                                  plugin_image.image_config(plugin_image.plugin_version(plugin_image.plugin_dir())),
                                  [plugin_image.image_name()]))
    assert digests == {plugin_image.describe(built)["digest"]}


def test_old_image_builds_are_pruned_but_never_the_one_in_use_or_one_in_progress(tmp_path: Path) -> None:
    """Each change to the sources builds a new image folder of about 200 MiB: the cache keeps the newest three."""
    import os

    from gpunode_sim.images import prune_builds

    folders = []
    for age, digest in enumerate(["aaaaaaaaaaaa", "bbbbbbbbbbbb", "cccccccccccc", "dddddddddddd", "eeeeeeeeeeee"]):
        folder = tmp_path / f"checker-image-{digest}"
        folder.mkdir()
        (folder / "image.json").write_text("{}")
        os.utime(folder, (1000 - age * 10, 1000 - age * 10))  # aaaa… the newest
        folders.append(folder)
    in_progress = tmp_path / "checker-image-ffffffffffff"
    in_progress.mkdir()  # no image.json yet
    (tmp_path / "plugin-image-base-851bddf897ce.tar").write_text("")
    in_use = folders[-1]  # the oldest, but the one this checkout runs
    gone = prune_builds(tmp_path, "checker-image-", in_use)
    assert sorted(p.name for p in gone) == ["checker-image-cccccccccccc", "checker-image-dddddddddddd"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checker-image-aaaaaaaaaaaa", "checker-image-bbbbbbbbbbbb", "checker-image-eeeeeeeeeeee",
        "checker-image-ffffffffffff", "plugin-image-base-851bddf897ce.tar"]
