"""Serves the simulated NVIDIA apt repository over HTTP on a unix socket.

Nodes reach it at ``http://127.0.0.1:8080`` inside their own network namespace,
through a forwarder to this socket; nothing listens on a host TCP port.
"""

from __future__ import annotations

import functools
import http.server
import os
import socketserver
import sys


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class RepoHandler(http.server.SimpleHTTPRequestHandler):
    def address_string(self) -> str:
        return "node"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's signature)
        sys.stderr.write("%s\n" % (format % args))


def main() -> int:
    root, socket_path = sys.argv[1], sys.argv[2]
    if os.path.exists(socket_path):
        os.unlink(socket_path)
    handler = functools.partial(RepoHandler, directory=root)
    with UnixHTTPServer(socket_path, handler) as server:
        os.chmod(socket_path, 0o666)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
