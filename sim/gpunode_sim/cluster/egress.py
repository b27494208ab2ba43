"""The API server's way to the nodes' kubelets: an HTTP CONNECT proxy on a unix socket.

A real kubelet refuses a loopback node IP, so each simulated node reports an
address of its own (``10.230.<block>.<n>``, on the loopback device of the node's
network namespace) that the host cannot route to. The API server's egress
selector sends its ``cluster`` traffic (logs, exec, port-forward to kubelets)
here; the proxy maps the node's address to the node's forwarder on the host's
loopback (``127.0.<block>.<n>``) and refuses everything else, so no byte leaves
loopback.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys

NODE_NETWORK = "10.230.0.0/16"
AGENT_NETWORK = "127.0.0.0/16"  # the fleets' blocks, 127.0.<block>.<n> (.254: a control plane, never a node)
KUBELET_PORT = 10250


def node_address(loopback: str) -> str:
    """The address a node's kubelet reports, for the node at ``127.0.B.N``."""
    _, _, block, number = loopback.split(".")
    return f"10.230.{block}.{number}"


def loopback_address(node: str) -> str | None:
    """The host's loopback forwarder for a node address, or None for anything that is not one.

    Nodes whose kubelet is the simulator's agent report their loopback address itself: it is kept.
    """
    try:
        address = ipaddress.ip_address(node)
    except ValueError:
        return None
    if address.version == 4 and address in ipaddress.ip_network(AGENT_NETWORK) and not str(address).endswith(".254"):
        return str(address)
    if address.version != 4 or address not in ipaddress.ip_network(NODE_NETWORK):
        return None
    _, _, block, number = str(address).split(".")
    return f"127.0.{block}.{number}"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        writer.close()
        return
    words = head.split(b"\r\n", 1)[0].decode(errors="replace").split()
    target = words[1] if len(words) == 3 and words[0] == "CONNECT" else ""
    host, _, port = target.rpartition(":")
    forward = loopback_address(host.strip("[]"))
    if forward is None or port != str(KUBELET_PORT):
        writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\nonly kubelets of the simulated fleet are reachable\r\n")
        writer.close()
        return
    try:
        node_reader, node_writer = await asyncio.wait_for(asyncio.open_connection(forward, KUBELET_PORT), 10)
    except (OSError, TimeoutError) as error:
        writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{forward}:{KUBELET_PORT}: {error}\r\n".encode())
        writer.close()
        return
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    await writer.drain()
    await asyncio.gather(_pipe(reader, node_writer), _pipe(node_reader, writer))


async def main(socket_path: str) -> None:
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    server = await asyncio.start_unix_server(_serve, path=socket_path)
    os.chmod(socket_path, 0o600)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
