"""The build module that lets Go build k8s.io/kubernetes' commands from the module proxy."""

from __future__ import annotations

import pytest
from gpunode_sim.build.kubernetes import build_module, built

from gpunode.errors import GpunodeError

GOMOD = """module k8s.io/kubernetes

go 1.25.0

require (
\tk8s.io/api v0.0.0
\tgo.etcd.io/etcd/server/v3 v3.7.0 // indirect
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kube-openapi => k8s.io/kube-openapi v0.0.0-20250910181357-589584f1c912
)
"""


def test_every_staging_module_is_pinned_to_its_published_version() -> None:
    module = build_module("1.37.2", GOMOD)
    assert "require k8s.io/kubernetes v1.37.2" in module
    assert "\tk8s.io/api => k8s.io/api v0.37.2\n" in module
    assert "\tk8s.io/client-go => k8s.io/client-go v0.37.2\n" in module
    assert "kube-openapi" not in module  # not a staging module: the version Kubernetes asks for stays
    assert "\ngo 1.25\n" in module


def test_a_gomod_without_staging_modules_is_refused() -> None:
    with pytest.raises(GpunodeError, match="names no staging modules"):
        build_module("1.37.2", "module k8s.io/kubernetes\n\ngo 1.25\n")


def test_an_unfinished_build_is_not_taken_for_a_cached_one(tmp_path) -> None:
    folder = tmp_path / "kubernetes-v1.37.2"
    folder.mkdir()
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "etcd"):
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
    assert built(tmp_path) is None  # no stamp: the build did not finish
    (folder / "build.json").write_text("{}")
    assert built(tmp_path) == folder
