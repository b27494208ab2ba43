"""Every inventory data key gpunode reads: name, type, default, allowed values and a one-line doc.

This schema is the single source for three things: the typed settings the
steps read (``settings.NodeSettings``, ``cluster.client.ClusterSettings``,
``cluster.manifests.ManifestSettings``, ``cluster.labels.LabelSettings`` take
their values through ``read``), the preflight's data check (``check_data``:
unknown keys with a did-you-mean, bad values with the key, the value and what
is allowed, each reported once for all the hosts that share it), and the
documented ``group_data/all.py`` that ``gpunode init`` writes (a test keeps
that file's keys and defaults equal to this list).

pyinfra's own keys (connector data such as ``ssh_user``, operation arguments
such as ``_sudo``) are pyinfra's to check; a key close to one of them or to
one of gpunode's is reported as a likely typo, any other key is left alone
(inventories carry data for other deploys too).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpunode.errors import GpunodeError

NVIDIA_KEY_URL = "https://nvidia.github.io/libnvidia-container/gpgkey"
NVIDIA_REPOSITORY_URL = "https://nvidia.github.io/libnvidia-container/stable/deb/$(ARCH)"
NVIDIA_RPM_REPOSITORY_URL = "https://nvidia.github.io/libnvidia-container/stable/rpm/$basearch"
NVIDIA_KEY_FINGERPRINT = "C95B321B61E88C1809C4F759DDCAE044F796ECB0"
RUNTIMES = ("auto", "containerd", "docker")
MIG_STRATEGIES = ("none", "single", "mixed")
LIST_STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
GPU_ALLOCATIONS = ("device-plugin", "dra")  # how a node's GPUs reach pods: one method per node, never both
TRUE_WORDS = ("true", "yes", "1")
FALSE_WORDS = ("false", "no", "0")


@dataclass(frozen=True)
class DataKey:
    """One inventory data key: what it is, what it accepts, and what it means."""

    name: str
    kind: type
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    pattern: str = ""  # a str value must match it in full
    hint: str = ""  # what a valid value looks like, for the message
    minimum: float | None = None
    check: Callable[[Any], str | None] | None = field(default=None, compare=False)  # extra: why it is refused

    def coerce(self, value: Any) -> Any:
        """The value as the code reads it, or a GpunodeError naming the key, the value and what is allowed."""
        if self.kind is bool:
            if isinstance(value, bool):
                return value
            word = str(value).strip().lower()
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            raise self.refuse(value, "true or false")
        if self.kind in (int, float):
            if isinstance(value, bool):
                raise self.refuse(value, "a number")
            try:
                number = self.kind(value)
            except (TypeError, ValueError):
                raise self.refuse(value, "a whole number" if self.kind is int else "a number") from None
            if self.minimum is not None and number < self.minimum:
                raise self.refuse(value, f"at least {self.minimum:g}")
            return number
        if self.kind is str:
            text = str(value)
            if self.choices and text not in self.choices:
                raise self.refuse(value, f"one of {', '.join(self.choices)}")
            if self.pattern and text and not re.fullmatch(self.pattern, text):
                raise self.refuse(value, self.hint or f"a value matching {self.pattern}")
            return text
        return value

    def refuse(self, value: Any, allowed: str) -> GpunodeError:
        return GpunodeError(f"inventory data {self.name} = {value!r} is not accepted: expected {allowed}",
                            f"fix {self.name} in the inventory or group_data (or the --data given); its default "
                            f"is {self.default!r}")


KEYS: tuple[DataKey, ...] = (
    # driver check
    DataKey("driver_min_version", str, "535", "oldest driver accepted (the GPU generation's own minimum applies too)",
            pattern=r"\d+(\.\d+){0,2}", hint="a driver version like 535 or 550.54.15"),
    DataKey("gpu_required", bool, False, "True: a host without a working GPU driver fails instead of being skipped"),
    # toolkit repository
    DataKey("toolkit_repository_url", str, NVIDIA_REPOSITORY_URL, "apt hosts' NVIDIA Container Toolkit repository",
            pattern=r"(https?|file)://\S+", hint="an http://, https:// or file:// URL"),
    DataKey("toolkit_rpm_repository_url", str, NVIDIA_RPM_REPOSITORY_URL, "dnf hosts' repository",
            pattern=r"(https?|file)://\S+", hint="an http://, https:// or file:// URL"),
    DataKey("toolkit_key_url", str, NVIDIA_KEY_URL, "the repository's signing key",
            pattern=r"(https?|file)://\S+", hint="an http://, https:// or file:// URL"),
    DataKey("toolkit_key_fingerprint", str, NVIDIA_KEY_FINGERPRINT, "checked before the key is trusted",
            pattern=r"[0-9A-F]{40}",
            hint=f"a 40-hex-digit fingerprint, upper case, no spaces (NVIDIA's is {NVIDIA_KEY_FINGERPRINT})"),
    # toolkit packages
    DataKey("toolkit_version", str, "1.17.8-1", "all four toolkit packages at this version",
            pattern=r"\d+\.\d+\.\d+-\d+", hint="a full package version like 1.17.8-1"),
    DataKey("toolkit_hold", bool, True, "apt-mark hold / dnf versionlock, so unattended upgrades do not move them"),
    # container runtime
    DataKey("container_runtime", str, "auto", "auto (docker if dockerd is installed, else containerd), containerd, "
            "docker", choices=RUNTIMES),
    DataKey("nvidia_runtime_default", bool, False,
            "False: pods use runtimeClassName: nvidia; True: nvidia is the default runtime"),
    DataKey("cdi_enabled", bool, False, "enable CDI in the runtime (enable_cdi / features.cdi)"),
    DataKey("containerd_systemd_cgroup", bool, True, "SystemdCgroup for runc when gpunode writes containerd's config"),
    DataKey("runtime_restart_timeout", int, 60, "seconds to wait for the runtime to answer after a restart",
            minimum=5),
    # cluster objects
    DataKey("plugin_image", str, "gpunode-device-plugin:0.1.0", "the device plugin's image (in your registry)",
            pattern=r"\S+", hint="an image reference like registry.example/gpunode-device-plugin:0.1.0"),
    DataKey("plugin_registry_username", str, "", "a registry user the nodes pull plugin_image as: the deploy keeps "
            "it in the Secret gpunode-registry, which the DaemonSet names", pattern=r"[^:\s]+",
            hint="a user name without ':' or spaces"),
    DataKey("plugin_registry_password", str, "", "that user's password (from your secret store: --data or an "
            "encrypted group_data file, never a committed one)"),
    DataKey("plugin_registry_cert_dir", str, "", "for gpunode itself (render, deploy resolve plugin_image's tag to "
            "its digest): a folder with the registry's CA as ca.crt; '' : the system's trust"),
    DataKey("plugin_pull_secret", str, "", "or: the name of a pull Secret you keep in the plugin's namespace",
            pattern=r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", hint="a Kubernetes object name (lower case, digits, '-', '.')"),
    DataKey("plugin_namespace", str, "gpunode-system", "the namespace of the device plugin's objects",
            pattern=r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", hint="a Kubernetes namespace name (lower case, digits, '-')"),
    DataKey("plugin_mig_strategy", str, "none", "none, single, mixed", choices=MIG_STRATEGIES),
    DataKey("checker_image", str, "", "the node checker's image (gpunode image build --node-checker): the deploy "
            "runs it as a DaemonSet on the GPU nodes; '' : no node checker", pattern=r"\S+",
            hint="an image reference like registry.example/gpunode-node-checker:0.1.0"),
    DataKey("checker_interval", int, 60, "seconds between the node checker's checks (--in-cluster calls results "
            "older than two intervals stale)", minimum=10),
    DataKey("checker_heartbeat", int, 300, "seconds between the node checker's status writes when its verdict has "
            "not changed (node-problem-detector's heartbeat period): --in-cluster calls results older than two "
            "heartbeats stale", minimum=10),
    DataKey("checker_api_server", str, "", "HOST:PORT of the API server as the GPU nodes reach it, where pods "
            "cannot use the kubernetes Service (no kube-proxy): the node checker and the DRA driver then use the "
            "node's network; '' : the Service", pattern=r"[^\s:/]+:[0-9]+", hint="HOST:PORT, e.g. 10.0.0.10:6443"),
    DataKey("plugin_device_list_strategy", str, "envvar", "envvar, volume-mounts, cdi-annotations, cdi-cri",
            choices=LIST_STRATEGIES),
    DataKey("gpu_allocation", str, "device-plugin", "per node: device-plugin (the kubelet counts nvidia.com/gpu) or "
            "dra (gpunode's DRA driver offers the GPUs as a ResourceSlice; needs cdi_enabled = True and "
            "plugin_device_list_strategy = volume-mounts); switching a node drains its GPU pods first",
            choices=GPU_ALLOCATIONS),
    DataKey("plugin_config", dict, None, "the plugin's own config file (NVIDIA's v1 format), carried in a ConfigMap"),
    DataKey("templates_dir", str, "", "a folder with your own device-plugin.yaml.j2; yours wins"),
    DataKey("label_model_key", str, "accelerator", "the short model label: accelerator=nvidia-a100",
            pattern=r"\S+", hint="a label key"),
    DataKey("label_model_prefix", str, "nvidia-", "the short model label's value prefix"),
    # cluster access
    DataKey("cluster_steps", bool, True, "False: provision the nodes only, never talk to Kubernetes"),
    DataKey("kubeconfig", str, "", "'' means $KUBECONFIG, else ~/.kube/config (as kubectl finds it); "
            "'in-cluster': the pod's ServiceAccount (the node checker)"),
    DataKey("kube_context", str, "", "'' means the kubeconfig's current-context"),
    DataKey("k8s_node_name", str, "", "per host: the Node's name when it is not the host's hostname"),
    DataKey("kube_timeout", float, 10.0, "seconds per API request", minimum=1),
    DataKey("rollout_timeout", int, 300, "seconds to wait for the device-plugin DaemonSet rollout", minimum=1),
    DataKey("allocatable_timeout", int, 150, "seconds to wait for a node's allocatable nvidia.com/gpu", minimum=1),
    # driver upgrades
    DataKey("reboot_on_mismatch", bool, False, "True: cordon, drain, reboot, re-check and uncordon a node whose "
            "driver was upgraded without reboot"),
    DataKey("reboot_timeout", int, 300, "seconds for the drain and for the node to come back", minimum=30),
    DataKey("max_unavailable", int, 0, "gpunode deploy only: hosts in batches of this size (0: all at once)",
            minimum=0),
)
BY_NAME: dict[str, DataKey] = {key.name: key for key in KEYS}


def read(data: Mapping[str, Any] | Any, name: str) -> Any:
    """The value of key ``name`` in pyinfra host data (a mapping or HostData), coerced; the default when unset."""
    key = BY_NAME[name]
    value = data.get(name) if hasattr(data, "get") else getattr(data, name, None)
    if value is None or (value == "" and key.kind is not str):
        return key.default
    return key.coerce(value)


def pyinfra_keys() -> frozenset[str]:
    """pyinfra's own data keys: operation arguments (``_sudo``...) and every connector's data (``ssh_user``...)."""
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors

    names = {name for name, _ in all_global_arguments()}
    for connector in get_all_connectors().values():
        names.update(getattr(connector, "data_meta", {}) or {})
    return frozenset(names)


@dataclass(frozen=True)
class DataProblem:
    """One problem with inventory data, and the hosts that have it."""

    key: str
    what: str
    fix: str
    hosts: tuple[str, ...]

    def line(self) -> str:
        where = "every host" if not self.hosts else ", ".join(self.hosts)
        return f"{self.what} ({where}); {self.fix}"


def problems_of(data: Mapping[str, Any], known: Iterable[str] | None = None) -> list[tuple[str, str, str]]:
    """(key, what, fix) for each problem in one host's data: a likely typo of a known key, or a refused value."""
    pyinfra_own = pyinfra_keys() if known is None else frozenset(known)
    everything = sorted(set(BY_NAME) | pyinfra_own)
    found = []
    for name in sorted(data):
        if name in BY_NAME:
            try:
                read(data, name)
            except GpunodeError as error:
                found.append((name, error.problem, error.fix or ""))
            continue
        if name in pyinfra_own:
            continue
        close = difflib.get_close_matches(name, everything, n=1, cutoff=0.8)
        if close:
            found.append((name, f"inventory data key {name!r} is not one gpunode or pyinfra reads",
                          f"did you mean {close[0]!r}?"))
    return found


def check_data(hosts: Mapping[str, Mapping[str, Any]]) -> list[DataProblem]:
    """The problems in every host's data, each once with the hosts it concerns (none listed: all of them)."""
    pyinfra_own = pyinfra_keys()
    seen: dict[tuple[str, str, str], list[str]] = {}
    for host, data in hosts.items():
        for problem in problems_of(data, pyinfra_own):
            seen.setdefault(problem, []).append(host)
    return [DataProblem(key, what, fix, () if len(names) == len(hosts) and len(hosts) > 1 else tuple(names))
            for (key, what, fix), names in seen.items()]
