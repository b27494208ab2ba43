"""The device-plugin step's manifests are rendered once per process and settings, and each host gets its own copy."""

from __future__ import annotations

import pytest

from gpunode.cluster import manifests
from gpunode.cluster.manifests import ManifestSettings, documents, manifest_documents, render


def test_rendered_once_per_settings_and_copied_per_call(monkeypatch: pytest.MonkeyPatch):
    calls: list[ManifestSettings] = []
    real_render = manifests.render

    def counting_render(settings: ManifestSettings, *args: object) -> str:
        calls.append(settings)
        return real_render(settings, *args)

    monkeypatch.setattr(manifests, "render", counting_render)
    monkeypatch.setattr(manifests, "_rendered", {})
    settings = ManifestSettings(image="registry.example/plugin:1.2.3")
    first, second = manifest_documents(settings), manifest_documents(settings)
    assert first == second == documents(real_render(settings))
    assert len(calls) == 1
    first[0]["metadata"]["name"] = "changed by one host"  # a host's change never reaches another's copy
    assert manifest_documents(settings)[0]["metadata"]["name"] != "changed by one host"
    other = manifest_documents(ManifestSettings(image="registry.example/plugin:2.0.0"))
    assert len(calls) == 2
    assert "registry.example/plugin:2.0.0" in str(other)


def test_the_c_loader_reads_what_the_python_loader_reads():
    import yaml

    text = render(ManifestSettings())
    assert documents(text) == [doc for doc in yaml.safe_load_all(text) if doc]
