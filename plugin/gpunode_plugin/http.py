"""HTTP endpoint for probes and metrics: /healthz, /readyz, /metrics."""

from __future__ import annotations

import http.server
import threading

from gpunode_plugin.manager import PluginManager


def serve(manager: PluginManager, address: str) -> http.server.ThreadingHTTPServer:
    host, _, port = address.rpartition(":")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's method name
            if self.path == "/healthz":
                ok, text = manager.health_status()
            elif self.path == "/readyz":
                ok, text = manager.ready_status()
            elif self.path == "/metrics":
                ok, text = True, manager.metrics_text()
            else:
                ok, text = False, f"no such endpoint {self.path}; try /healthz, /readyz, /metrics"
                self.send_response(404)
                self._body(text)
                return
            self.send_response(200 if ok else 503)
            self._body(text)

        def _body(self, text: str) -> None:
            data = (text if text.endswith("\n") else text + "\n").encode()
            content = "text/plain; version=0.0.4" if self.path == "/metrics" else "text/plain"
            self.send_header("Content-Type", content)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
            return None

    server = http.server.ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
