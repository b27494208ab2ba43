"""Operations of the labels step: the node's GPU labels, applied server-side as field manager ``gpunode``.

All of a node's labels go in one apply, so a node never carries half a set; a
label gpunode applied before and that no longer holds is dropped from the set
and the API removes it; a label another manager holds with another value is
left alone (with a warning). A node whose labels are up to date gets no write.
"""

from __future__ import annotations

from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node
from pyinfra import host, logger, state
from pyinfra.api import Host, operation

from gpunode.cluster.client import FIELD_MANAGER, ClusterSettings, api_call
from gpunode.cluster.labels import PLUGIN_LABEL, LabelSettings, driver_version_of, gpu_labels
from gpunode.diagnosis.labels import diagnose, plan, up_to_date
from gpunode.errors import GpunodeError
from gpunode.facts.coexistence import ForeignDaemonSet, read_foreign, registrar_on
from gpunode.facts.labels import NodeLabelsState, read_node, read_nodes
from gpunode.operations import control_command, failing_command
from gpunode.operations.driver import reboot_planned
from gpunode.operations.reboot import fresh_driver_state
from gpunode.operations.run_state import host_run, run_of


def node_of_run(settings: ClusterSettings, name: str) -> NodeLabelsState:
    """The Node ``name`` from the run's one list of the cluster's Nodes (``exists=False`` when it is not there).

    Operations decide from it whether there is anything to do; what they then wait for is read fresh.
    """
    per_cluster = run_of(state).nodes  # one list of the Nodes per run and cluster
    key = (str(settings.kubeconfig_path), settings.kube_context)
    if key not in per_cluster:
        per_cluster[key] = read_nodes(settings)
    return per_cluster[key].get(name) or NodeLabelsState(name, exists=False)


def foreign_of_run(settings: ClusterSettings) -> list[ForeignDaemonSet]:
    """NVIDIA's device plugin and GFD DaemonSets from the run's one list of the cluster's DaemonSets."""
    per_cluster = run_of(state).foreign  # one list per run and cluster
    key = (str(settings.kubeconfig_path), settings.kube_context)
    if key not in per_cluster:
        per_cluster[key] = read_foreign(settings)
    return per_cluster[key]


def nvidia_serves(settings: ClusterSettings, node_name: str) -> ForeignDaemonSet | None:
    """NVIDIA's device plugin DaemonSet when its pod serves the node and gpunode's does not (the node, as this run
    first read it, lacks ``gpunode.io/device-plugin=true``): gpunode then leaves the node to it. Read from the
    run's one list of DaemonSets, and only for nodes without gpunode's label."""
    if node_of_run(settings, node_name).labels.get(PLUGIN_LABEL) == "true":
        return None
    return registrar_on(foreign_of_run(settings), node_name)


def labelled_driver(target: Host) -> str | None:
    """The driver version the node's labels said before this run changed them (None: unknown or none)."""
    return host_run(target).labelled_driver


def relabelled(target: Host) -> bool:
    """True when this run changes the host's node labels (its plugin pod may come or go)."""
    return host_run(target).relabelled


def apply_labels(target: Host, settings: ClusterSettings, node: str, labels: dict[str, str]) -> None:
    """Server-side apply of exactly ``labels`` as gpunode's set on ``node`` (never forced)."""
    body = Node(apiVersion="v1", kind="Node", metadata=ObjectMeta(name=node, labels=labels))
    api_call(settings, f"label node {node}", lambda client: client.apply(body, field_manager=FIELD_MANAGER))


def apply_fresh_labels(target: Host, settings: ClusterSettings, node: str, label_settings: LabelSettings) -> None:
    """After a reboot in this run: the labels from the driver facts read then, applied if they differ."""
    state = fresh_driver_state(target)
    if state is None:
        raise GpunodeError(f"no driver facts after the reboot of {node}", "re-run the deploy")
    computed = gpu_labels(state["nvidia_smi"]["gpus"], label_settings)
    current = read_node(settings, node)
    if current.labels.get(PLUGIN_LABEL) != "true" and registrar_on(read_foreign(settings), node) is not None:
        computed.labels.pop(PLUGIN_LABEL, None)  # NVIDIA's plugin serves it: no second registrar after a reboot
    host_run(target).labelled_driver = driver_version_of(current.labels)
    wanted, _ = plan(current, computed.labels)
    if not up_to_date(current, wanted):
        apply_labels(target, settings, node, wanted)
        target.log(f"node {node} relabelled for driver {state['nvidia_smi']['gpus'][0]['driver_version']}")


@operation()
def applied(node_name: str, labels: dict[str, str], settings: ClusterSettings,
            label_settings: LabelSettings | None = None):
    """
    Make ``labels`` gpunode's labels on the Kubernetes node ``node_name``.

    + node_name: the Node's name in the cluster
    + labels: the full set gpunode wants there ({} removes every label gpunode set); on a host this run
      reboots, the labels are computed from the driver facts read after the reboot instead
    + settings: which cluster (kubeconfig, context)
    + label_settings: the model label's key and prefix (for the labels after a reboot)
    """
    if reboot_planned(host):
        host_run(host).relabelled = True
        yield control_command(apply_fresh_labels, settings, node_name, label_settings or LabelSettings())
        return
    try:
        node = node_of_run(settings, node_name)
    except GpunodeError as error:
        yield failing_command(str(error))
        return
    host_run(host).labelled_driver = driver_version_of(node.labels)
    if labels.get(PLUGIN_LABEL):
        try:
            registrar = nvidia_serves(settings, node_name)
        except GpunodeError as error:
            yield failing_command(str(error))
            return
        if registrar is not None:  # never a second nvidia.com/gpu registrar on one node
            labels = {key: value for key, value in labels.items() if key != PLUGIN_LABEL}
            host.log_styled(
                f"warning: node {node_name}: NVIDIA's device plugin {registrar.reference} (pod "
                f"{registrar.pods[node_name]}) serves nvidia.com/gpu here; gpunode does not add a second registrar "
                f"(its plugin is not placed on this node). Move the node with 'gpunode migrate INVENTORY --limit "
                f"{host.name}' (one node at a time, running GPU pods undisturbed), or remove NVIDIA's plugin",
                fg="yellow", log_func=logger.warning)
    findings = diagnose(node, labels)
    missing = [f for f in findings if f.code == "node-missing"]
    if missing:
        yield failing_command(str(missing[0]))
        return
    for finding in findings:
        if not finding.breaks:
            host.log_styled(f"warning: {finding.what}", fg="yellow", log_func=logger.warning)
    wanted, _ = plan(node, labels)
    if up_to_date(node, wanted):
        host.noop(f"node {node_name}: {len(wanted)} gpunode label(s) up to date")
        return
    host_run(host).relabelled = True
    yield control_command(apply_labels, settings, node_name, wanted)
