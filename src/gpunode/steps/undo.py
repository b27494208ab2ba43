"""The way back: what gpunode did to a node and its cluster, undone (``gpunode undo``).

Not a step of the chain: the chain's steps in reverse, each from gpunode's own records (backups, field
managers), so nothing another tool or an admin set is touched.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api.deploy import deploy

from gpunode.host_settings import settings_of
from gpunode.operations import undo
from gpunode.steps.driver import node_name


@deploy("Undo")
def undo_node(packages: bool = False) -> None:
    parsed = settings_of(host)
    cluster = parsed.cluster
    if cluster.cluster_steps:
        undo.cluster_objects_deleted(name="Delete gpunode's cluster objects",
                                     namespace=parsed.manifests.namespace, settings=cluster,
                                     _run_once=True)
        undo.labels_removed(name="Remove gpunode's node labels", node_name=node_name(cluster), settings=cluster)
    undo.toolkit_released(name="Release the toolkit packages" + (" and remove them" if packages else ""),
                          packages=packages)
    undo.files_restored(name="Put back the files gpunode changed",
                        restart_timeout=parsed.node.runtime_restart_timeout, packages=packages)
