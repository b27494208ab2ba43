"""The Kubernetes permissions gpunode needs, as RBAC objects an admin applies once, and a 403 read back as a rule.

Every API call of the cluster steps, verify and doctor is covered by exactly one rule below, and nothing more:

* cluster-wide (a ClusterRole): nodes (read, list, label, cordon), pods (read, list: doctor ``--pod`` and the
  reboot's drain look in every namespace), evictions (the drain), pod logs and events (doctor ``--pod`` reads the
  pod's own output and events, doctor the plugin pods' and the nodes' Warning events), a workload named instead of
  a pod and what refuses its pods (doctor ``--pod``: deployments, statefulsets, replicasets, jobs, resource quotas,
  limit ranges), the plugin's namespace and the ``nvidia`` RuntimeClass by name (read, apply and delete), and the
  list of DaemonSets (is NVIDIA's device plugin or GFD already on the nodes?);
* in the plugin's namespace (a Role): the ServiceAccount, ConfigMap and DaemonSet gpunode applies (and deletes:
  ``gpunode undo``), the list of ConfigMaps (the node checker's records, ``verify --in-cluster``), the plugin's
  pods (delete: a plugin restart) and the image pull Secret it writes from the inventory's registry credentials
  (by name, but for create, which RBAC cannot limit to a name).

``gpunode migrate`` alone needs more, and only for the DaemonSets it moves nodes from: read and patch NVIDIA's
device-plugin DaemonSet, by name, in its namespace (``--rbac --migrate-from NAMESPACE/NAME``).

Server-side apply of an object that does not exist yet is authorized as ``patch`` and as ``create``, so both are
granted for what gpunode applies. The namespace itself is part of what ``gpunode render --rbac`` prints: the Role
lives in it, so the admin creates it with the rules, and gpunode may only read and patch that one namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from gpunode.cluster.manifests import CHECKER_TEMPLATE, DRA_TEMPLATE, PULL_SECRET, RUNTIME_CLASS, ManifestSettings
from gpunode.cluster.manifests import documents as manifest_yaml
from gpunode.cluster.manifests import render as render_template
from gpunode.errors import GpunodeError

NAME = "gpunode"
DRA_CLASSES = ("gpu.gpunode.io", "mig.gpu.gpunode.io")  # the DeviceClasses device-plugin.yaml.j2 renders
DEFAULT_SUBJECT = "User:gpunode"
SUBJECT_KINDS = ("User", "Group", "ServiceAccount")


@dataclass(frozen=True)
class Rule:
    """One RBAC rule: API group, resource (``pods/eviction`` for a subresource), verbs, names it is limited to."""

    group: str
    resource: str
    verbs: tuple[str, ...]
    names: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        rule: dict = {"apiGroups": [self.group], "resources": [self.resource], "verbs": list(self.verbs)}
        if self.names:
            rule["resourceNames"] = list(self.names)
        return rule


def cluster_rules(namespace: str) -> list[Rule]:
    return [
        Rule("", "nodes", ("get", "list", "patch")),
        Rule("", "pods", ("get", "list")),
        Rule("", "pods/eviction", ("create",)),
        Rule("", "pods/log", ("get",)),
        Rule("", "events", ("list",)),
        Rule("", "namespaces", ("get", "patch"), (namespace,)),
        Rule("node.k8s.io", "runtimeclasses", ("get", "create", "patch", "delete"), (RUNTIME_CLASS,)),
        Rule("apps", "daemonsets", ("list",)),  # NVIDIA's device plugin or GFD already on the nodes? (coexistence)
        # doctor --pod of a workload whose pods are missing: the workload, its ReplicaSets, the namespace's quotas
        Rule("apps", "deployments", ("get",)),
        Rule("apps", "statefulsets", ("get",)),
        Rule("apps", "replicasets", ("get", "list")),
        Rule("batch", "jobs", ("get",)),
        Rule("", "resourcequotas", ("list",)),
        Rule("", "limitranges", ("list",)),
        # doctor --pod of a pod with ResourceClaims: every claim (who holds which device) and what nodes offer
        Rule("resource.k8s.io", "resourceclaims", ("list",)),
        Rule("resource.k8s.io", "resourceslices", ("list",)),
        Rule("resource.k8s.io", "deviceclasses", ("list",)),
        # the DRA driver's DeviceClasses, applied where a node has gpu_allocation = dra (create: not by name)
        Rule("resource.k8s.io", "deviceclasses", ("get", "patch", "delete"), DRA_CLASSES),
        Rule("resource.k8s.io", "deviceclasses", ("create",)),
    ]


def migration_rules() -> list[Rule]:
    """In the namespace of NVIDIA's device-plugin DaemonSet, for ``gpunode migrate`` only: read it and add the
    node affinity that keeps it off the nodes gpunode's plugin serves (limited to that DaemonSet by name)."""
    return [Rule("apps", "daemonsets", ("get", "patch"))]


def namespace_rules() -> list[Rule]:
    return [
        Rule("", "serviceaccounts", ("get", "create", "patch", "delete")),  # delete: gpunode undo
        Rule("", "configmaps", ("get", "list", "create", "patch", "delete")),  # list: the node checker's records
        Rule("apps", "daemonsets", ("get", "create", "patch", "delete")),
        Rule("", "pods", ("delete",)),
        # the pull Secret written from plugin_registry_username/_password: read, patched and deleted by name only;
        # create cannot be limited to a name (the API server authorizes it before the object has one)
        Rule("", "secrets", ("get", "patch", "delete"), (PULL_SECRET,)),
        Rule("", "secrets", ("create",)),
    ]


def parse_subject(text: str) -> dict:
    """``User:NAME``, ``Group:NAME`` or ``ServiceAccount:NAMESPACE/NAME`` as an RBAC subject."""
    kind, sep, name = text.partition(":")
    if not sep or kind not in SUBJECT_KINDS or not name:
        raise GpunodeError(f"subject {text!r} is not KIND:NAME",
                           "write User:NAME, Group:NAME or ServiceAccount:NAMESPACE/NAME, e.g. User:gpunode")
    if kind == "ServiceAccount":
        sa_namespace, slash, sa_name = name.partition("/")
        if not slash or not sa_namespace or not sa_name:
            raise GpunodeError(f"subject {text!r}: a ServiceAccount is NAMESPACE/NAME",
                               "for example ServiceAccount:ci/gpunode")
        return {"kind": kind, "name": sa_name, "namespace": sa_namespace}
    return {"kind": kind, "name": name, "apiGroup": "rbac.authorization.k8s.io"}


def parse_daemonset(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` of a DaemonSet."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise GpunodeError(f"DaemonSet {text!r} is not NAMESPACE/NAME",
                           "for example kube-system/nvidia-device-plugin-daemonset (kubectl get ds -A lists them)")
    return namespace, name


def documents(namespace: str, subject: str = DEFAULT_SUBJECT, migrate_from: tuple[str, ...] = ()) -> list[dict]:
    """The Namespace, ClusterRole, ClusterRoleBinding, Role and RoleBinding that let ``subject`` run gpunode;
    with ``migrate_from`` (NAMESPACE/NAME of NVIDIA's plugin DaemonSets), a Role and RoleBinding per DaemonSet
    for ``gpunode migrate``, limited to it by name."""
    who = parse_subject(subject)
    group = "rbac.authorization.k8s.io/v1"
    labels = {"app.kubernetes.io/managed-by": NAME}
    migration = []
    for reference in migrate_from:
        ds_namespace, ds_name = parse_daemonset(reference)
        role = f"{NAME}-migrate-{ds_name}"[:63]
        rules = [{**r.as_dict(), "resourceNames": [ds_name]} for r in migration_rules()]
        migration += [
            {"apiVersion": group, "kind": "Role", "metadata": {"name": role, "namespace": ds_namespace,
                                                               "labels": labels}, "rules": rules},
            {"apiVersion": group, "kind": "RoleBinding", "metadata": {"name": role, "namespace": ds_namespace,
                                                                      "labels": labels},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role}, "subjects": [who]},
        ]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {"apiVersion": group, "kind": "ClusterRole", "metadata": {"name": NAME, "labels": labels},
         "rules": [r.as_dict() for r in cluster_rules(namespace)]},
        {"apiVersion": group, "kind": "ClusterRoleBinding", "metadata": {"name": NAME, "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
         "subjects": [who]},
        {"apiVersion": group, "kind": "Role", "metadata": {"name": NAME, "namespace": namespace, "labels": labels},
         "rules": [r.as_dict() for r in namespace_rules()]},
        {"apiVersion": group, "kind": "RoleBinding", "metadata": {"name": NAME, "namespace": namespace,
                                                                  "labels": labels},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME},
         "subjects": [who]},
    ] + migration


def own_pods_documents(namespace: str) -> list[dict]:
    """The node checker's rights and its own-node policy (``templates/node-checker.yaml.j2``), then the DRA
    driver's (``templates/dra-driver.yaml.j2``): the rights of gpunode's own pods."""
    settings = ManifestSettings(namespace=namespace)
    return [*manifest_yaml(render_template(settings, name=CHECKER_TEMPLATE)),
            *manifest_yaml(render_template(settings, name=DRA_TEMPLATE))]


def render(namespace: str, subject: str = DEFAULT_SUBJECT, migrate_from: tuple[str, ...] = ()) -> str:
    """gpunode's rights for ``subject``, then the node checker's and the DRA driver's for their ServiceAccounts:
    what an admin applies."""
    return yaml.safe_dump_all([*documents(namespace, subject, migrate_from), *own_pods_documents(namespace)],
                              sort_keys=False)


# the API server's words for an RBAC denial (k8s.io/apiserver's forbidden message)
DENIED = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)"'
                    r'(?: in API group "(?P<group>[^"]*)")?'
                    r'(?: at the cluster scope| in the namespace "(?P<namespace>[^"]+)")?')


def missing_rule(message: str) -> str | None:
    """The RBAC rule a 403 message asks for, as YAML-ish text to add, or None when the message is not RBAC's."""
    match = DENIED.search(message)
    if not match:
        return None
    if match["user"].endswith(":gpunode-node-checker"):  # the node checker's own ServiceAccount
        return ("apply the node checker's rights (ClusterRole gpunode-node-checker and its bindings: "
                "gpunode render INVENTORY --rbac prints them)")
    where = f"the Role {NAME} in namespace {match['namespace']}" if match["namespace"] else f"the ClusterRole {NAME}"
    group = match["group"] or ""
    return (f"add to {where}: {{apiGroups: [\"{group}\"], resources: [\"{match['resource']}\"], "
            f"verbs: [\"{match['verb']}\"]}} for user {match['user']} (gpunode render INVENTORY --rbac prints every "
            "rule gpunode needs)")
