"""The DRA driver's kubelet side over real unix sockets: registration, prepare and unprepare of claims, with a
claim reader in place of the API server (the fleet test runs it against the real kubelet and API server)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from gpunode_plugin.api import dra_pb2, dra_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from gpunode_plugin.dra_claims import CDI_KIND, ClaimPreparer, ClaimRef
from gpunode_plugin.dra_devices import DRIVER
from gpunode_plugin.dra_driver import DraService, Registration, serve

UID = "4f8d5a2e-0c1b-4c7e-9a55-2b1f0e7d9c11"
PUBLISHED = {"gpu-0": "GPU-aaa", "gpu-1": "GPU-bbb", "gpu-2": "GPU-ccc"}


def claim(uid: str = UID, results: list[dict] | None = None, allocated: bool = True) -> dict:
    body: dict = {"metadata": {"name": "train-gpus", "namespace": "ml", "uid": uid}, "status": {}}
    if allocated:
        body["status"]["allocation"] = {"devices": {"results": results if results is not None else [
            {"request": "gpus", "driver": DRIVER, "pool": "node01", "device": "gpu-2"},
            {"request": "gpus", "driver": DRIVER, "pool": "node01", "device": "gpu-0"},
            {"request": "nic", "driver": "net.example.com", "pool": "node01", "device": "eth1"}]}}
    return body


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[tuple[dra_pb2_grpc.DRAPluginStub, dict, Path]]:
    claims: dict = {("ml", "train-gpus"): claim()}
    reads: list[str] = []

    def read_claim(namespace: str, name: str) -> dict:
        reads.append(f"{namespace}/{name}")
        return claims[(namespace, name)]

    preparer = ClaimPreparer("node01", str(tmp_path / "state"), str(tmp_path / "cdi"), read_claim,
                             lambda: dict(PUBLISHED))
    socket = tmp_path / "state/dra.sock"
    server = serve(dra_pb2_grpc.add_DRAPluginServicer_to_server, DraService(preparer), str(socket))
    channel = grpc.insecure_channel(f"unix://{socket}")
    try:
        yield dra_pb2_grpc.DRAPluginStub(channel), {"claims": claims, "reads": reads, "preparer": preparer}, tmp_path
    finally:
        channel.close()
        server.stop(0)


def prepare(stub: dra_pb2_grpc.DRAPluginStub, *uids: str) -> dra_pb2.NodePrepareResourcesResponse:
    return stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(
        claims=[dra_pb2.Claim(namespace="ml", uid=uid, name="train-gpus") for uid in uids]), timeout=5)


def test_a_prepared_claim_gets_a_cdi_spec_of_exactly_its_devices_and_unprepare_removes_it(driver) -> None:
    stub, state, tmp_path = driver
    answer = prepare(stub, UID).claims[UID]
    assert answer.error == ""
    assert [(d.device_name, d.pool_name, list(d.request_names), list(d.cdi_device_ids)) for d in answer.devices] == [
        ("gpu-0", "node01", ["gpus"], [f"{CDI_KIND}={UID}-gpu-0"]),
        ("gpu-2", "node01", ["gpus"], [f"{CDI_KIND}={UID}-gpu-2"])]  # not the other driver's NIC
    spec = json.loads((tmp_path / f"cdi/{DRIVER}-claim-{UID}.json").read_text())
    assert spec["kind"] == CDI_KIND and [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-0", f"{UID}-gpu-2"]
    edits = spec["devices"][1]["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices"]
    assert edits["mounts"][0]["containerPath"] == "/var/run/nvidia-container-devices/GPU-ccc"
    # the kubelet asks again (a retry, or after the driver restarted): the same answer, without the API
    again = ClaimPreparer("node01", str(tmp_path / "state"), str(tmp_path / "cdi"), lambda *_: {}, dict)
    assert [d.device_name for d in again.prepare(ClaimRef("ml", UID, "train-gpus"))] == ["gpu-0", "gpu-2"]
    assert state["reads"] == ["ml/train-gpus"]
    gone = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(
        claims=[dra_pb2.Claim(namespace="ml", uid=UID, name="train-gpus")]), timeout=5)
    assert gone.claims[UID].error == ""
    assert not (tmp_path / f"cdi/{DRIVER}-claim-{UID}.json").exists() and state["preparer"].prepared() == {}
    assert stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(  # never prepared here: done
        claims=[dra_pb2.Claim(namespace="ml", uid=UID, name="train-gpus")]), timeout=5).claims[UID].error == ""


@pytest.mark.parametrize(("body", "words"), [
    (claim(uid="0b4f9d3c-aaaa-4bbb-8ccc-000000000000"), "it was deleted and created again"),
    (claim(allocated=False), "is not allocated"),
    (claim(results=[{"request": "gpus", "driver": DRIVER, "pool": "node02", "device": "gpu-0"}]),
     f"has no device of {DRIVER} in pool node01"),
    (claim(results=[{"request": "gpus", "driver": DRIVER, "pool": "node01", "device": "gpu-7"}]),
     "device(s) gpu-7 of claim ml/train-gpus are not on this node any more (unhealthy or gone)"),
])
def test_a_claim_that_cannot_be_prepared_is_answered_with_why_and_nothing_is_written(driver, body: dict,
                                                                                     words: str) -> None:
    stub, state, tmp_path = driver
    state["claims"][("ml", "train-gpus")] = body
    answer = prepare(stub, UID).claims[UID]
    assert answer.error.startswith(f"{DRIVER}: ") and words in answer.error, answer.error
    assert list(answer.devices) == [] and list((tmp_path / "cdi").iterdir()) == []
    assert state["preparer"].prepared() == {}


def test_registration_names_the_driver_its_socket_and_the_v1_service(tmp_path: Path) -> None:
    registration = Registration("/var/lib/kubelet/plugins/gpu.gpunode.io/dra.sock")
    socket = tmp_path / "reg.sock"
    server = serve(pluginregistration_pb2_grpc.add_RegistrationServicer_to_server, registration, str(socket))
    try:
        with grpc.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
            assert (info.type, info.name, info.endpoint, list(info.supported_versions)) == (
                "DRAPlugin", DRIVER, "/var/lib/kubelet/plugins/gpu.gpunode.io/dra.sock", ["v1.DRAPlugin"])
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=False, error="version not supported"), timeout=5)
            assert registration.error == "version not supported" and not registration.registered.is_set()
            stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True),
                                          timeout=5)
            assert registration.registered.is_set() and registration.error == ""
    finally:
        server.stop(0)
