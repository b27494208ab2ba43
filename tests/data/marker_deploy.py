"""A one-operation pyinfra deploy the end-to-end tests run on every simulated node."""

from pyinfra import host
from pyinfra.operations import files

files.put(
    name="Write the end-to-end marker file",
    src=__file__,
    dest="/etc/gpunode-e2e-marker.py",
    mode="644",
)
files.line(
    name="Record the node's own name in the marker log",
    path="/etc/gpunode-e2e-marker.log",
    line=f"seen {host.name}",
)
