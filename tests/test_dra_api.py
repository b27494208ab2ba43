"""The plugin's DRA and plugin-registration protos describe the kubelet's wire exactly (facts from k8s.io/kubelet)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from gpunode_plugin.api import dra_pb2, pluginregistration_pb2

FIXTURES = Path(__file__).parent / "fixtures/kubelet-api"
FIELD = descriptor_pb2.FieldDescriptorProto


def wire_facts(module: object) -> dict:
    """Every message's fields (name, number, type, label, message type, proto3 optional) and every service's
    methods, as tests/fixtures/kubelet-api/README.md says they were read from upstream."""
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)  # type: ignore[attr-defined]
    facts: dict = {}

    def walk(message: descriptor_pb2.DescriptorProto, prefix: str) -> None:
        facts[f"message {prefix}{message.name}"] = sorted(
            [f.name, f.number, FIELD.Type.Name(f.type), FIELD.Label.Name(f.label), f.type_name.rsplit(".", 1)[-1],
             f.proto3_optional] for f in message.field)
        for nested in message.nested_type:
            walk(nested, f"{prefix}{message.name}.")

    for message in proto.message_type:
        walk(message, f"{proto.package}.")
    for service in proto.service:
        facts[f"service {proto.package}.{service.name}"] = sorted(
            [m.name, m.input_type.rsplit(".", 1)[-1], m.output_type.rsplit(".", 1)[-1]] for m in service.method)
    return facts


@pytest.mark.parametrize(("module", "fixture"), [(dra_pb2, "dra-v1.json"),
                                                 (pluginregistration_pb2, "pluginregistration-v1.json")])
def test_the_plugins_protos_are_the_kubelets_wire(module: object, fixture: str) -> None:
    assert wire_facts(module) == json.loads((FIXTURES / fixture).read_text())
