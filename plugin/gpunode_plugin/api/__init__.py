"""The kubelet device-plugin API v1beta1 (stubs generated from deviceplugin.proto by grpcio-tools).

Regenerate after editing the .proto, from plugin/:
    python -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. gpunode_plugin/api/deviceplugin.proto
"""

from gpunode_plugin.api import deviceplugin_pb2 as pb
from gpunode_plugin.api import deviceplugin_pb2_grpc as rpc

VERSION = "v1beta1"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins/"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"

__all__ = ["pb", "rpc", "VERSION", "DEVICE_PLUGIN_DIR", "KUBELET_SOCKET", "HEALTHY", "UNHEALTHY"]
