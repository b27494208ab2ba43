"""Operations of ``gpunode undo``: the node and the cluster as they were before gpunode, from its own records.

What gpunode changed, it recorded: the files it wrote have their earliest backups (``facts.backups``),
the labels it set are owned by its field manager, its cluster objects carry its field manager. Undo puts
back exactly that and nothing else; each operation reads first and does nothing where nothing is left.
"""

from __future__ import annotations

import shlex

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import DaemonSet
from lightkube.resources.core_v1 import ConfigMap, Node, Secret, ServiceAccount
from lightkube.resources.node_v1 import RuntimeClass
from lightkube.resources.resource_v1 import DeviceClass
from pyinfra import host
from pyinfra.api import Host, operation

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call, get_or_none
from gpunode.cluster.manifests import CHECKER, NODE_SETTINGS, PULL_SECRET, RUNTIME_CLASS
from gpunode.cluster.plugin_config import CONFIG_MAP
from gpunode.cluster.rbac import DRA_CLASSES
from gpunode.diagnosis.device_plugin import DRA_DAEMONSET
from gpunode.facts.backups import Backups
from gpunode.facts.device_plugin import DAEMONSET
from gpunode.facts.labels import read_node
from gpunode.facts.toolkit import ToolkitPackages
from gpunode.operations import control_command
from gpunode.operations.runtime import READY_CHECK
from gpunode.settings import TOOLKIT_CONFIG, TOOLKIT_PACKAGES

RUNTIME_FILES = {"containerd": "/etc/containerd/", "docker": "/etc/docker/"}
# files the toolkit packages own (their post-install writes config.toml): put back only with the packages removed,
# since packages that stay keep the config they run with
PACKAGE_FILES = (TOOLKIT_CONFIG,)


def drop_gpunode_labels(target: Host, settings: ClusterSettings, node: str) -> None:
    """An apply of no labels as gpunode's field manager: the API removes exactly the labels gpunode owns."""
    body = Node(apiVersion="v1", kind="Node", metadata=ObjectMeta(name=node, labels={}))
    api_call(settings, f"remove gpunode's labels from node {node}",
             lambda client: client.apply(body, field_manager=FIELD_MANAGER))
    target.log(f"node {node}: gpunode's labels removed")


@operation()
def labels_removed(node_name: str, settings: ClusterSettings):
    """
    Remove the labels gpunode set on the node (only those its field manager owns; GFD's and others' stay).

    + node_name: the Node's name in the cluster
    + settings: which cluster
    """
    node = read_node(settings, node_name)
    if not node.exists:
        host.noop(f"no Node named {node_name}")
        return
    if not node.ours:
        host.noop(f"node {node_name} carries no label of gpunode's")
        return
    yield control_command(drop_gpunode_labels, settings, node_name)


def owned_by_gpunode(item: object) -> bool:
    fields = getattr(getattr(item, "metadata", None), "managedFields", None) or []
    return any(entry.manager == FIELD_MANAGER for entry in fields)


def cluster_objects(settings: ClusterSettings, namespace: str) -> list[tuple[type, str, str | None]]:
    """gpunode's objects that exist: (kind, name, namespace), the DaemonSet first (its pods leave with it)."""
    wanted = [(DaemonSet, DAEMONSET, namespace), (DaemonSet, CHECKER, namespace), (ConfigMap, CONFIG_MAP, namespace),
              (ConfigMap, NODE_SETTINGS, namespace), (ServiceAccount, DAEMONSET, namespace),
              (ServiceAccount, CHECKER, namespace), (Secret, PULL_SECRET, namespace),
              (RuntimeClass, RUNTIME_CLASS, None), (DaemonSet, DRA_DAEMONSET, namespace),
              (ServiceAccount, DRA_DAEMONSET, namespace), *((DeviceClass, name, None) for name in DRA_CLASSES)]

    def read(client: object) -> list[tuple[type, str, str | None]]:
        return [(kind, name, ns) for kind, name, ns in wanted
                if owned_by_gpunode(get_or_none(client, kind, name, namespace=ns))]

    return api_call(settings, f"read gpunode's objects in {namespace}", read)


def delete_objects(target: Host, settings: ClusterSettings, objects: list[tuple[type, str, str | None]]) -> None:
    for kind, name, namespace in objects:
        api_call(settings, f"delete {kind.__name__.lower()} {name}",
                 lambda client, kind=kind, name=name, namespace=namespace: client.delete(kind, name,
                                                                                         namespace=namespace))
        target.log(f"deleted {kind.__name__} {namespace + '/' if namespace else ''}{name}")


@operation()
def cluster_objects_deleted(namespace: str, settings: ClusterSettings):
    """
    Delete the device plugin's DaemonSet, ConfigMap, ServiceAccount and pull Secret, the node checker's
    DaemonSet, settings and ServiceAccount, the DRA driver's DaemonSet, ServiceAccount and DeviceClasses, and the
    ``nvidia`` RuntimeClass, where gpunode's field manager applied
    them (the checker's own records and Node conditions stay: they are its, and go stale). The namespace stays (an
    admin created it with gpunode's RBAC).

    + namespace: the plugin's namespace
    + settings: which cluster
    """
    objects = cluster_objects(settings, namespace)
    if not objects:
        host.noop(f"no object of gpunode's left in {namespace} (nor the RuntimeClass {RUNTIME_CLASS})")
        return
    yield control_command(delete_objects, settings, objects)


@operation()
def toolkit_released(packages: bool):
    """
    Release the toolkit packages' holds (apt-mark unhold / dnf versionlock delete) and, with ``packages``,
    remove the four packages (apt purge / dnf remove).

    + packages: also remove the packages (they may have been there before gpunode: only when asked)
    """
    state = host.get_fact(ToolkitPackages)
    installed = [name for name in TOOLKIT_PACKAGES if state["versions"].get(name)]
    q = " ".join
    if state["family"] not in ("deb", "rpm"):
        host.noop("neither apt nor dnf: no toolkit packages to release")
        return
    changed = False
    if state["held"]:
        yield (f"apt-mark unhold {q(state['held'])}" if state["family"] == "deb"
               else f"dnf -q versionlock delete {q(state['held'])}")
        changed = True
    if packages and installed:
        yield (f"DEBIAN_FRONTEND=noninteractive apt-get purge -y -q {q(installed)}" if state["family"] == "deb"
               else f"dnf -q -y remove {q(installed)}")
        changed = True
    if not changed:
        host.noop("toolkit packages not held" + ("" if packages or not installed else
                                                 f" ({len(installed)} installed; --packages removes them)"))


@operation()
def files_restored(restart_timeout: int, packages: bool = False):
    """
    Put every file gpunode changed back as its earliest backup has it (remove the ones it added), then
    restart a container runtime whose config came back, and wait until it answers.

    + restart_timeout: seconds to wait for the runtime after its restart
    + packages: the toolkit packages were removed: their config.toml goes back too (else it stays with them)
    """
    backups = host.get_fact(Backups)
    pending = {path: entry for path, entry in backups.items() if entry["now"] != "same"
               and (packages or path not in PACKAGE_FILES)}
    if not pending:
        host.noop(f"every file gpunode changed is as before ({len(backups)} backed up)" if backups
                  else "gpunode changed no file here (no backups)")
        return
    for path, entry in sorted(pending.items()):
        if entry["absent_before"]:
            yield f"rm -f {shlex.quote(path)}"
        else:
            yield f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')} && cp -a {shlex.quote(entry['saved'])} " \
                  f"{shlex.quote(path)}"
    for runtime, folder in RUNTIME_FILES.items():
        if any(path.startswith(folder) for path in pending):
            check = READY_CHECK[runtime]
            yield "\n".join([
                f"systemctl restart {runtime} || true",
                f"end=$(( $(date +%s) + {restart_timeout} ))",
                f"until ( {check} ) >/dev/null 2>&1; do",
                "  if [ \"$(date +%s)\" -ge \"$end\" ]; then",
                f"    echo \"gpunode: {runtime} did not answer within {restart_timeout} s after its config was put "
                "back\" >&2; exit 1",
                "  fi",
                "  sleep 0.5",
                "done",
            ])
