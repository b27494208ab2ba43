"""The object store of the simulated control plane: objects, resource versions, server-side apply.

Server-side apply follows Kubernetes' rules for what gpunode does with it: each
field manager owns the fields it applied (``managedFields``, FieldsV1), a field
another manager owns with a different value is a conflict unless the apply is
forced, a field a manager stops applying is removed unless someone else owns
it, and an apply that changes nothing writes nothing (no new resourceVersion).
Simplification, documented: lists are atomic (Kubernetes merges some lists by
key, such as containers by name).
"""

from __future__ import annotations

import copy
import itertools
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime

Path_ = tuple[str, ...]
UNTRACKED = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}


@dataclass(frozen=True)
class Kind:
    """A resource the control plane serves."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def describe(self) -> str:
        """The resource as Kubernetes names it in messages (``daemonsets.apps``, ``nodes``)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


KINDS = (
    Kind("", "v1", "nodes", "Node", False),
    Kind("", "v1", "namespaces", "Namespace", False),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True),
    Kind("", "v1", "pods", "Pod", True),
    Kind("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True),
    Kind("", "v1", "events", "Event", True),
)
NODE, NAMESPACE, SERVICE_ACCOUNT, POD, RUNTIME_CLASS, DAEMONSET, EVENT = KINDS


class ApiFailure(Exception):
    """A request the API answers with a Status object."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


def not_found(kind: Kind, name: str) -> ApiFailure:
    return ApiFailure(404, "NotFound", f'{kind.describe()} "{name}" not found',
                      {"name": name, "group": kind.group, "kind": kind.plural} if kind.group
                      else {"name": name, "kind": kind.plural})


def leaves(obj: dict, prefix: Path_ = ()) -> dict[Path_, object]:
    """The leaf fields of ``obj``: maps are walked (an empty one sets nothing), anything else is one field."""
    found: dict[Path_, object] = {}
    for key, value in obj.items():
        path = (*prefix, key)
        if isinstance(value, dict):
            found.update(leaves(value, path))
        else:
            found[path] = value
    return found


def get_path(obj: dict, path: Path_) -> object:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def set_path(obj: dict, path: Path_, value: object) -> None:
    for key in path[:-1]:
        if not isinstance(obj.get(key), dict):
            obj[key] = {}
        obj = obj[key]
    obj[path[-1]] = copy.deepcopy(value)


def delete_path(obj: dict, path: Path_) -> None:
    parents = [obj]
    for key in path[:-1]:
        obj = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(obj, dict):
            return
        parents.append(obj)
    parents[-1].pop(path[-1], None)


def fields_v1(paths: set[Path_]) -> dict:
    """FieldsV1 (``{"f:metadata": {"f:labels": {"f:x": {}}}}``) of a set of field paths."""
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return tree


def field_label(path: Path_) -> str:
    return "." + ".".join(path)


@dataclass
class ManagedEntry:
    manager: str
    operation: str  # Apply | Update
    api_version: str
    fields: set[Path_] = field(default_factory=set)
    time: str = ""

    def render(self) -> dict:
        return {"manager": self.manager, "operation": self.operation, "apiVersion": self.api_version,
                "time": self.time, "fieldsType": "FieldsV1", "fieldsV1": fields_v1(self.fields)}


@dataclass
class Stored:
    kind: Kind
    obj: dict
    managed: list[ManagedEntry] = field(default_factory=list)

    def entry(self, manager: str, operation: str) -> ManagedEntry | None:
        return next((e for e in self.managed if e.manager == manager and e.operation == operation), None)

    def render(self) -> dict:
        out = copy.deepcopy(self.obj)
        out["metadata"]["managedFields"] = [e.render() for e in self.managed if e.fields]
        return out


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Store:
    """Objects by (kind, namespace, name); every change gets the next resourceVersion."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], Stored] = {}
        self._versions = itertools.count(1000)
        self.version = str(next(self._versions))

    @staticmethod
    def key(kind: Kind, namespace: str, name: str) -> tuple[str, str, str]:
        return (kind.plural, namespace if kind.namespaced else "", name)

    def get(self, kind: Kind, namespace: str, name: str) -> Stored | None:
        return self.objects.get(self.key(kind, namespace, name))

    def require(self, kind: Kind, namespace: str, name: str) -> Stored:
        stored = self.get(kind, namespace, name)
        if stored is None:
            raise not_found(kind, name)
        return stored

    def items(self, kind: Kind, namespace: str | None = None) -> list[Stored]:
        return [s for (plural, ns, _), s in sorted(self.objects.items())
                if plural == kind.plural and (namespace is None or ns == namespace)]

    def bump(self, stored: Stored, spec_changed: bool = False) -> None:
        self.version = str(next(self._versions))
        stored.obj["metadata"]["resourceVersion"] = self.version
        if spec_changed:
            stored.obj["metadata"]["generation"] = stored.obj["metadata"].get("generation", 1) + 1

    def create(self, kind: Kind, obj: dict) -> Stored:
        meta = obj.setdefault("metadata", {})
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        meta["generation"] = 1
        stored = Stored(kind, obj)
        self.objects[self.key(kind, meta.get("namespace", ""), meta["name"])] = stored
        self.bump(stored)
        return stored

    def delete(self, kind: Kind, namespace: str, name: str) -> Stored:
        stored = self.require(kind, namespace, name)
        del self.objects[self.key(kind, namespace, name)]
        self.version = str(next(self._versions))
        return stored

    def apply(self, kind: Kind, namespace: str, name: str, body: dict, manager: str,
              force: bool) -> tuple[Stored, bool]:
        """Server-side apply of ``body`` by ``manager``; returns the object and whether it changed."""
        applied = {p: v for p, v in leaves(body).items() if p not in UNTRACKED}
        stored = self.get(kind, namespace, name)
        created = stored is None
        if stored is None:
            obj = {"metadata": {"name": name}}
            if kind.namespaced:
                obj["metadata"]["namespace"] = namespace
            stored = self.create(kind, obj)
        before = copy.deepcopy(stored.obj)
        before_managed = [(e.manager, e.operation, frozenset(e.fields)) for e in stored.managed]
        conflicts = [(e.manager, p) for e in stored.managed
                     if not (e.manager == manager and e.operation == "Apply")
                     for p in sorted(e.fields & applied.keys()) if get_path(stored.obj, p) != applied[p]]
        if conflicts and not force:
            if created:
                self.delete(kind, namespace, name)
            raise conflict_failure(kind, name, conflicts)
        for other_manager, path in conflicts:
            for e in stored.managed:
                if e.manager == other_manager:
                    e.fields.discard(path)
        mine = stored.entry(manager, "Apply")
        if mine is None:
            mine = ManagedEntry(manager, "Apply", kind.api_version)
            stored.managed.append(mine)
        for path in mine.fields - applied.keys():
            if not any(path in e.fields for e in stored.managed if e is not mine):
                delete_path(stored.obj, path)
        for path, value in applied.items():
            set_path(stored.obj, path, value)
        mine.fields = set(applied)
        stored.managed = [e for e in stored.managed if e.fields]
        changed = created or stored.obj != before or before_managed != [
            (e.manager, e.operation, frozenset(e.fields)) for e in stored.managed]
        if changed:
            mine.time = now()
            if not created:
                self.bump(stored, spec_changed=before.get("spec") != stored.obj.get("spec"))
        return stored, changed

    def merge_patch(self, kind: Kind, namespace: str, name: str, patch: dict, manager: str) -> tuple[Stored, bool]:
        """JSON merge patch (what ``kubectl label`` amounts to for labels): an Update by ``manager``."""
        stored = self.require(kind, namespace, name)
        before = copy.deepcopy(stored.obj)
        touched: set[Path_] = set()
        for path, value in leaves(patch).items():
            if path in UNTRACKED:
                continue
            if value is None:
                delete_path(stored.obj, path)
                for e in stored.managed:
                    e.fields.discard(path)
                continue
            if get_path(stored.obj, path) != value:
                set_path(stored.obj, path, value)
                touched.add(path)
        if touched:
            for e in stored.managed:
                e.fields -= touched
            mine = stored.entry(manager, "Update")
            if mine is None:
                mine = ManagedEntry(manager, "Update", kind.api_version)
                stored.managed.append(mine)
            mine.fields |= touched
            mine.time = now()
        stored.managed = [e for e in stored.managed if e.fields]
        changed = stored.obj != before
        if changed:
            self.bump(stored, spec_changed=before.get("spec") != stored.obj.get("spec"))
        return stored, changed


def conflict_failure(kind: Kind, name: str, conflicts: list[tuple[str, Path_]]) -> ApiFailure:
    """409 as the API server words it: ``Apply failed with 1 conflict: conflict with "x" using v1: .metadata...``."""
    if len(conflicts) == 1:
        manager, path = conflicts[0]
        message = f'Apply failed with 1 conflict: conflict with "{manager}" using {kind.api_version}: ' \
                  f"{field_label(path)}"
    else:
        lines = "\n".join(f'- conflict with "{m}" using {kind.api_version}: {field_label(p)}' for m, p in conflicts)
        message = f"Apply failed with {len(conflicts)} conflicts:\n{lines}"
    causes = [{"reason": "FieldManagerConflict", "message": f'conflict with "{m}" using {kind.api_version}',
               "field": field_label(p)} for m, p in conflicts]
    details = {"name": name, "kind": kind.plural, "causes": causes}
    if kind.group:
        details["group"] = kind.group
    return ApiFailure(409, "Conflict", message, details)
