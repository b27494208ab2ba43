"""gpunode's RBAC objects (``gpunode render --rbac``) and the rule a 403 asks for, from the API server's words."""

from __future__ import annotations

import pytest

from gpunode.cluster import rbac
from gpunode.errors import GpunodeError

# messages as kube-apiserver's RBAC authorizer words them (the cluster-scope one is quoted by tests/test_rollout.py
# from the simulated fleet's real API server)
DENIALS = [
    ('nodes is forbidden: User "gpunode-viewer" cannot list resource "nodes" in API group "" at the cluster scope',
     'add to the ClusterRole gpunode: {apiGroups: [""], resources: ["nodes"], verbs: ["list"]} for user '
     "gpunode-viewer"),
    ('daemonsets.apps "gpunode-device-plugin" is forbidden: User "gpunode" cannot patch resource "daemonsets" in API '
     'group "apps" in the namespace "gpunode-system"',
     'add to the Role gpunode in namespace gpunode-system: {apiGroups: ["apps"], resources: ["daemonsets"], '
     'verbs: ["patch"]} for user gpunode'),
    ('pods "train-0" is forbidden: User "gpunode" cannot create resource "pods/eviction" in API group "" in the '
     'namespace "ml"',
     'add to the Role gpunode in namespace ml: {apiGroups: [""], resources: ["pods/eviction"], verbs: ["create"]} '
     "for user gpunode"),
]


@pytest.mark.parametrize(("message", "rule"), DENIALS)
def test_a_denial_names_the_rule_to_add(message: str, rule: str) -> None:
    said = rbac.missing_rule(message)
    assert said is not None and said.startswith(rule), said
    assert "gpunode render INVENTORY --rbac" in said


def test_other_forbidden_messages_name_no_rule() -> None:
    assert rbac.missing_rule('pods "x" is forbidden: exceeded quota: gpu, requested: requests.nvidia.com/gpu=1') \
        is None


def test_every_rule_names_one_resource_and_applied_objects_can_be_created_and_patched() -> None:
    docs = rbac.documents("gpunode-system", "User:gpunode")
    assert [d["kind"] for d in docs] == ["Namespace", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    cluster, namespaced = docs[1]["rules"], docs[3]["rules"]
    assert all(len(r["resources"]) == 1 for r in cluster + namespaced)
    by_resource = {r["resources"][0]: r for r in namespaced}
    for applied in ("serviceaccounts", "configmaps", "daemonsets"):  # server-side apply creates: patch and create
        assert {"get", "create", "patch"} <= set(by_resource[applied]["verbs"])
    namespaces = next(r for r in cluster if r["resources"] == ["namespaces"])
    assert namespaces["resourceNames"] == ["gpunode-system"] and "create" not in namespaces["verbs"]
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in cluster + namespaced)
    assert docs[2]["subjects"] == [{"kind": "User", "name": "gpunode", "apiGroup": "rbac.authorization.k8s.io"}]


@pytest.mark.parametrize(("subject", "expected"), [
    ("Group:gpu-admins", {"kind": "Group", "name": "gpu-admins", "apiGroup": "rbac.authorization.k8s.io"}),
    ("ServiceAccount:ci/gpunode", {"kind": "ServiceAccount", "name": "gpunode", "namespace": "ci"}),
])
def test_subjects(subject: str, expected: dict) -> None:
    assert rbac.parse_subject(subject) == expected


@pytest.mark.parametrize("subject", ["gpunode", "Robot:x", "ServiceAccount:gpunode", "User:"])
def test_a_bad_subject_is_refused_with_the_forms_allowed(subject: str) -> None:
    with pytest.raises(GpunodeError, match="KIND:NAME|NAMESPACE/NAME"):
        rbac.parse_subject(subject)
