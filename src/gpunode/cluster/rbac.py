"""The Kubernetes permissions gpunode needs, as RBAC objects an admin applies once, and a 403 read back as a rule.

Every API call of the cluster steps, verify and doctor is covered by exactly one rule below, and nothing more:

* cluster-wide (a ClusterRole): nodes (read, list, label, cordon), pods (read, list: doctor ``--pod`` and the
  reboot's drain look in every namespace), evictions (the drain), pod logs and events (doctor ``--pod`` reads the
  pod's own output and events, doctor the plugin pods'), the plugin's namespace and the ``nvidia`` RuntimeClass by
  name (read and apply);
* in the plugin's namespace (a Role): the ServiceAccount, ConfigMap and DaemonSet gpunode applies, and the
  plugin's pods (delete: a plugin restart).

Server-side apply of an object that does not exist yet is authorized as ``patch`` and as ``create``, so both are
granted for what gpunode applies. The namespace itself is part of what ``gpunode render --rbac`` prints: the Role
lives in it, so the admin creates it with the rules, and gpunode may only read and patch that one namespace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from gpunode.cluster.manifests import RUNTIME_CLASS
from gpunode.errors import GpunodeError

NAME = "gpunode"
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
        Rule("node.k8s.io", "runtimeclasses", ("get", "create", "patch"), (RUNTIME_CLASS,)),
    ]


def namespace_rules() -> list[Rule]:
    return [
        Rule("", "serviceaccounts", ("get", "create", "patch")),
        Rule("", "configmaps", ("get", "create", "patch")),
        Rule("apps", "daemonsets", ("get", "create", "patch")),
        Rule("", "pods", ("delete",)),
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


def documents(namespace: str, subject: str = DEFAULT_SUBJECT) -> list[dict]:
    """The Namespace, ClusterRole, ClusterRoleBinding, Role and RoleBinding that let ``subject`` run gpunode."""
    who = parse_subject(subject)
    group = "rbac.authorization.k8s.io/v1"
    labels = {"app.kubernetes.io/managed-by": NAME}
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
    ]


def render(namespace: str, subject: str = DEFAULT_SUBJECT) -> str:
    return yaml.safe_dump_all(documents(namespace, subject), sort_keys=False)


# the API server's words for an RBAC denial (k8s.io/apiserver's forbidden message)
DENIED = re.compile(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) resource "(?P<resource>[^"]+)"'
                    r'(?: in API group "(?P<group>[^"]*)")?'
                    r'(?: at the cluster scope| in the namespace "(?P<namespace>[^"]+)")?')


def missing_rule(message: str) -> str | None:
    """The RBAC rule a 403 message asks for, as YAML-ish text to add, or None when the message is not RBAC's."""
    match = DENIED.search(message)
    if not match:
        return None
    where = f"the Role {NAME} in namespace {match['namespace']}" if match["namespace"] else f"the ClusterRole {NAME}"
    group = match["group"] or ""
    return (f"add to {where}: {{apiGroups: [\"{group}\"], resources: [\"{match['resource']}\"], "
            f"verbs: [\"{match['verb']}\"]}} for user {match['user']} (gpunode render INVENTORY --rbac prints every "
            "rule gpunode needs)")
