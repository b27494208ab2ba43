"""The simulated fleet refuses, before starting anything, a size the host's inotify instances cannot carry."""

from __future__ import annotations

from gpunode_sim.fleet import INOTIFY_PER_KUBELET_NODE, inotify_shortfall


def test_fifty_real_kubelets_are_refused_with_the_numbers() -> None:
    # seen: `sim up -n 50` left 26 containerd nodes with "inotify_init: too many open files" (limit 128)
    said = inotify_shortfall(38, 128, 4)
    assert said is not None and f"need about {38 * INOTIFY_PER_KUBELET_NODE} inotify instances" in said
    assert "fs.inotify.max_user_instances = 128, 4 in use" in said


def test_the_test_fleets_fit() -> None:
    assert inotify_shortfall(2, 128, 20) is None  # the session fleet: two containerd nodes
    assert inotify_shortfall(15, 128, 0) is None  # the 20-node bench: 15 containerd nodes
