"""Access to the Kubernetes API: which cluster (inventory data), a client, and API errors in plain words.

lightkube is the client: typed resources and server-side apply with a field
manager, synchronous, small. Every API failure becomes a GpunodeError with one
line naming the cause (unreachable, credentials refused, RBAC denied, missing
object, apply conflict) and the fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ApiError, Client, ConfigError, KubeConfig

from gpunode.cluster.rbac import missing_rule
from gpunode.errors import GpunodeError
from gpunode.inventory_data import BY_NAME, read

FIELD_MANAGER = "gpunode"
DEFAULT_KUBECONFIG = "~/.kube/config"
IN_CLUSTER = "in-cluster"  # kubeconfig = 'in-cluster': the pod's ServiceAccount token and CA, as client-go reads them


@dataclass(frozen=True)
class ClusterSettings:
    """Inventory data for the cluster steps; each field is the data key of the same name."""

    cluster_steps: bool = BY_NAME["cluster_steps"].default
    kubeconfig: str = BY_NAME["kubeconfig"].default
    kube_context: str = BY_NAME["kube_context"].default
    k8s_node_name: str = BY_NAME["k8s_node_name"].default
    kube_timeout: float = BY_NAME["kube_timeout"].default
    rollout_timeout: int = BY_NAME["rollout_timeout"].default
    allocatable_timeout: int = BY_NAME["allocatable_timeout"].default

    @classmethod
    def from_data(cls, data: Any) -> ClusterSettings:
        """Settings from pyinfra host data (a mapping or HostData), each value checked by its schema."""
        return cls(**{field.name: read(data, field.name) for field in fields(cls)})

    @property
    def kubeconfig_path(self) -> Path:
        """The kubeconfig as kubectl finds it: the data key, else $KUBECONFIG (first file), else ~/.kube/config."""
        chosen = self.kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or DEFAULT_KUBECONFIG
        return Path(chosen).expanduser()

    @property
    def where(self) -> str:
        return f"{self.kubeconfig_path}" + (f", context {self.kube_context}" if self.kube_context else "")


_clients: dict[tuple[str, str], tuple[Client, str]] = {}


def connect(settings: ClusterSettings) -> tuple[Client, str]:
    """A client for the configured cluster (one per kubeconfig and context) and the API server's URL."""
    key = (str(settings.kubeconfig_path), settings.kube_context)
    if key in _clients:
        return _clients[key]
    if settings.kubeconfig == IN_CLUSTER:
        try:
            single = KubeConfig.from_service_account().get()
        except (ConfigError, OSError) as error:
            raise GpunodeError(f"kubeconfig 'in-cluster': no ServiceAccount credentials in this pod ({error})",
                               "run it in a pod whose ServiceAccount token is mounted "
                               "(automountServiceAccountToken: true), or give a kubeconfig file") from error
        _clients[key] = (Client(single, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(settings.kube_timeout),
                                trust_env=False), single.cluster.server)
        return _clients[key]
    path = settings.kubeconfig_path
    if not path.is_file():
        raise GpunodeError(f"no kubeconfig at {path}",
                           "set kubeconfig = '/path/to/kubeconfig' in the inventory data (or KUBECONFIG), or "
                           "cluster_steps = False to provision the nodes only")
    try:
        config = KubeConfig.from_file(path)
        single = config.get(settings.kube_context or None)
    except ConfigError as error:
        contexts = ", ".join(sorted(config.contexts)) if "config" in locals() else "none"
        raise GpunodeError(f"kubeconfig {path}: {error}",
                           f"set kube_context to one of: {contexts}") from error
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise GpunodeError(f"kubeconfig {path} cannot be read: {error}",
                           "check the file (kubectl config view) or point kubeconfig at another one") from error
    client = Client(single, field_manager=FIELD_MANAGER, timeout=httpx2.Timeout(settings.kube_timeout),
                    trust_env=False)
    _clients[key] = (client, single.cluster.server)
    return _clients[key]


def explain(error: Exception, settings: ClusterSettings, server: str, action: str) -> GpunodeError:
    """One line on why ``action`` failed against the API, and the fix."""
    if isinstance(error, GpunodeError):
        return error
    if isinstance(error, ApiError):
        status = error.status
        code = status.code
        if code == 401:
            return GpunodeError(f"{action}: the Kubernetes API at {server} refused the credentials of {settings.where} "
                                "(401 Unauthorized: expired or revoked)",
                                "renew the credentials in the kubeconfig (a new token or client certificate)")
        if code == 403 and "ValidatingAdmissionPolicy" in (status.message or ""):
            return GpunodeError(f"{action}: refused by an admission policy: {status.message}",
                                "the policy's words say what it allows; kubectl get validatingadmissionpolicies "
                                "shows its rules")
        if code == 403:
            return GpunodeError(f"{action}: RBAC denied: {status.message}",
                                missing_rule(status.message or "") or
                                "apply the rules 'gpunode render INVENTORY --rbac' prints for the user, or use a "
                                "context that has them (kube_context)")
        if code == 409:
            return GpunodeError(f"{action}: {status.message}",
                                "another field manager owns these fields; gpunode never takes them over: change or "
                                "remove them with the tool that set them")
        return GpunodeError(f"{action}: {status.message} ({code} {status.reason})")
    if isinstance(error, httpx2.TransportError):
        return GpunodeError(f"{action}: cannot reach the Kubernetes API at {server} ({error or type(error).__name__})",
                            f"check that the API server is up and that {settings.where} points at it")
    return GpunodeError(f"{action}: {type(error).__name__}: {error}")


RETRYABLE_STATUS = (429, 500, 502, 503, 504)


def transient(error: BaseException) -> bool:
    """True for an API failure that a wait may retry: a timeout, a dropped connection, an overloaded server.

    Seen at 100 simulated nodes: reads timing out while 75 device-plugin pods started at once. Credentials,
    RBAC, a missing object or a conflict are not transient.
    """
    cause = error.__cause__ if isinstance(error, GpunodeError) and error.__cause__ is not None else error
    if isinstance(cause, httpx2.TransportError):
        return True
    return isinstance(cause, ApiError) and cause.status.code in RETRYABLE_STATUS


def get_or_none(client: Client, resource: Any, name: str, namespace: str | None = None) -> Any:
    """The object, or None when the API answers 404 (any other failure is raised)."""
    try:
        return client.get(resource, name, namespace=namespace)
    except ApiError as error:
        if error.status.code == 404:
            return None
        raise


def api_call(settings: ClusterSettings, action: str, call: Any) -> Any:
    """Run ``call(client)``; any failure comes back as an explained GpunodeError."""
    server = ""
    try:
        client, server = connect(settings)
        return call(client)
    except Exception as error:  # noqa: BLE001 - every API failure is explained, none escapes raw
        raise explain(error, settings, server, action) from error
