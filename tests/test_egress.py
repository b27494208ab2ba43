"""The API server's way to the nodes' kubelets: node addresses go to loopback forwarders, nothing else goes anywhere."""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path

import pytest
from gpunode_sim.cluster import egress


@pytest.mark.parametrize(("node", "forward"), [
    ("10.230.20.1", "127.0.20.1"), ("10.230.243.99", "127.0.243.99"),
    ("127.0.20.2", "127.0.20.2"),  # a node whose kubelet is the simulator's agent reports its loopback address
    ("10.231.20.1", None), ("8.8.8.8", None), ("127.0.20.254", None), ("127.1.0.1", None), ("node01", None),
    ("::1", None),
])
def test_only_node_addresses_map_to_loopback(node: str, forward: str | None) -> None:
    assert egress.loopback_address(node) == forward


def test_node_address_is_the_loopback_ones_twin() -> None:
    assert egress.node_address("127.0.30.2") == "10.230.30.2"
    assert egress.loopback_address(egress.node_address("127.0.30.2")) == "127.0.30.2"


def connect(socket_path: Path, target: str) -> bytes:
    with socket.socket(socket.AF_UNIX) as client:
        client.settimeout(10)
        client.connect(str(socket_path))
        client.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        answer = client.recv(4096)
        if answer.startswith(b"HTTP/1.1 200"):
            client.sendall(b"ping")
            answer += client.recv(4096)
        return answer


def test_the_proxy_pipes_to_a_nodes_forwarder_and_refuses_the_rest(tmp_path: Path) -> None:
    kubelet = socket.socket()
    kubelet.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    kubelet.bind(("127.0.250.9", egress.KUBELET_PORT))  # a node's forwarder on the host's loopback
    kubelet.listen()

    def answer() -> None:
        connection, _ = kubelet.accept()
        with connection:
            connection.sendall(b"pong:" + connection.recv(16))

    threading.Thread(target=answer, daemon=True).start()
    socket_path = tmp_path / "egress.sock"
    loop = asyncio.new_event_loop()
    server = loop.create_task(egress.main(str(socket_path)))

    def serve() -> None:
        try:
            loop.run_until_complete(server)
        except asyncio.CancelledError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    for _ in range(100):
        if socket_path.exists():
            break
        threading.Event().wait(0.05)
    try:
        assert connect(socket_path, "10.230.250.9:10250").endswith(b"pong:ping")
        assert connect(socket_path, "8.8.8.8:10250").startswith(b"HTTP/1.1 403")
        assert connect(socket_path, "10.230.250.9:22").startswith(b"HTTP/1.1 403")
    finally:
        kubelet.close()
        loop.call_soon_threadsafe(server.cancel)
        thread.join(5)
        loop.close()
