"""Preparing a ResourceClaim's GPUs on this node for the kubelet (DRA's NodePrepareResources) and undoing it.

Prepare reads the claim's allocation (the scheduler wrote which of this driver's devices it got), writes one CDI
spec for the claim and answers the kubelet with the CDI device IDs, which the kubelet hands to the container
runtime (containerd with CDI on injects them). Unprepare removes the spec. What was prepared is kept in a
checkpoint file, so a restarted driver answers a repeated prepare with what it prepared before (without the API)
and can unprepare a claim whose object is gone.

How the GPUs reach the container: each claimed device is a CDI device whose edits are the device plugin's
``volume-mounts`` strategy (``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one mount per GPU
under it, named by its UUID), which NVIDIA's runtime reads where ``accept-nvidia-visible-devices-as-volume-mounts``
is on and which composes: a container with two claims gets both claims' GPUs (an ``NVIDIA_VISIBLE_DEVICES`` list
per claim would not: the last one would win). The pod runs with the ``nvidia`` runtime, as for the device plugin.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gpunode_plugin.dra_devices import DRIVER

CDI_KIND = f"{DRIVER}/claim"
CDI_VERSION = "0.5.0"  # what containerd 1.7's CDI library reads; env and mounts need no newer one
VOLUME_MOUNTS = "/var/run/nvidia-container-devices"
SPEC_PREFIX = f"{DRIVER}-claim-"  # /var/run/cdi/gpu.gpunode.io-claim-<uid>.json
UID = re.compile(r"^[0-9a-f-]{1,64}$")


class PrepareError(Exception):
    """Why a claim cannot be prepared here, in words for the kubelet's event."""


@dataclass(frozen=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimRef:
    namespace: str
    uid: str
    name: str


ReadClaim = Callable[[str, str], dict]  # (namespace, name) -> the ResourceClaim as the API returns it
DeviceUuids = Callable[[], dict[str, str]]  # device name ("gpu-0") -> GPU or MIG UUID, as published


def allocated(claim: dict, ref: ClaimRef, pool: str) -> list[tuple[str, str]]:
    """(request, device) of each device allocated to the claim from this driver's pool on this node."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != ref.uid:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has uid {meta.get('uid')}, not {ref.uid}: "
                           "it was deleted and created again")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    results = ((allocation.get("devices") or {}).get("results")) or []
    mine = [(r["request"], r["device"]) for r in results if r.get("driver") == DRIVER and r.get("pool") == pool]
    if not mine:
        raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name} has no device of {DRIVER} in pool {pool}")
    return mine


def cdi_spec(uid: str, devices: dict[str, str]) -> dict:
    """The claim's CDI spec: one CDI device per claimed device (``<uid>-<device>``)."""
    return {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": [
        {"name": f"{uid}-{name}",
         "containerEdits": {"env": [f"NVIDIA_VISIBLE_DEVICES={VOLUME_MOUNTS}"],
                            "mounts": [{"hostPath": "/dev/null", "containerPath": f"{VOLUME_MOUNTS}/{uuid}",
                                        "options": ["ro", "nosuid", "nodev", "bind"]}]}}
        for name, uuid in sorted(devices.items())]}


class ClaimPreparer:
    """Prepare and unprepare claims on this node, with the checkpoint in ``state_dir`` and specs in ``cdi_dir``."""

    def __init__(self, pool: str, state_dir: str, cdi_dir: str, read_claim: ReadClaim, uuids: DeviceUuids) -> None:
        self.pool = pool
        self.cdi_dir = cdi_dir
        self.checkpoint = os.path.join(state_dir, "checkpoint.json")
        self.read_claim = read_claim
        self.uuids = uuids
        self.lock = threading.Lock()
        os.makedirs(state_dir, exist_ok=True)
        os.makedirs(cdi_dir, exist_ok=True)

    def _load(self) -> dict[str, dict]:
        try:
            with open(self.checkpoint) as handle:
                data = json.load(handle)
        except FileNotFoundError:
            return {}
        return data.get("claims", {}) if isinstance(data, dict) else {}

    def _save(self, claims: dict[str, dict]) -> None:
        temporary = f"{self.checkpoint}.tmp"
        with open(temporary, "w") as handle:
            json.dump({"driver": DRIVER, "claims": claims}, handle, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.checkpoint)  # never a half-written checkpoint after a crash

    def spec_path(self, uid: str) -> str:
        return os.path.join(self.cdi_dir, f"{SPEC_PREFIX}{uid}.json")

    def prepared(self) -> dict[str, dict]:
        with self.lock:
            return self._load()

    def prepare(self, ref: ClaimRef) -> list[PreparedDevice]:
        if not UID.match(ref.uid):
            raise PrepareError(f"claim uid {ref.uid!r} is not a Kubernetes UID")
        with self.lock:
            claims = self._load()
            if ref.uid in claims:  # again (a kubelet retry, or after our restart): the same answer
                return [PreparedDevice(**{**d, "request_names": tuple(d["request_names"]),
                                          "cdi_device_ids": tuple(d["cdi_device_ids"])})
                        for d in claims[ref.uid]["devices"]]
        claim = self.read_claim(ref.namespace, ref.name)
        wanted = allocated(claim, ref, self.pool)
        published = self.uuids()
        missing = sorted({device for _, device in wanted} - set(published))
        if missing:
            raise PrepareError(f"device(s) {', '.join(missing)} of claim {ref.namespace}/{ref.name} are not on this "
                               f"node any more (unhealthy or gone): this node offers {', '.join(sorted(published))}")
        by_device: dict[str, list[str]] = {}
        for request, device in wanted:
            by_device.setdefault(device, []).append(request)
        devices = [PreparedDevice(tuple(requests), self.pool, device, (f"{CDI_KIND}={ref.uid}-{device}",))
                   for device, requests in sorted(by_device.items())]
        spec = cdi_spec(ref.uid, {device: published[device] for device in by_device})
        with self.lock:
            temporary = f"{self.spec_path(ref.uid)}.tmp"
            with open(temporary, "w") as handle:
                json.dump(spec, handle, indent=1)
            os.replace(temporary, self.spec_path(ref.uid))
            claims = self._load()
            claims[ref.uid] = {"namespace": ref.namespace, "name": ref.name,
                               "devices": [asdict(d) for d in devices]}
            self._save(claims)
        return devices

    def unprepare(self, ref: ClaimRef) -> None:
        """Remove the claim's spec and checkpoint entry; a claim never prepared here is already unprepared."""
        if not UID.match(ref.uid):
            raise PrepareError(f"claim uid {ref.uid!r} is not a Kubernetes UID")
        with self.lock:
            try:
                os.remove(self.spec_path(ref.uid))
            except FileNotFoundError:
                pass
            claims = self._load()
            if claims.pop(ref.uid, None) is not None:
                self._save(claims)
