"""The few API requests the DRA driver makes, with the pod's ServiceAccount: read a claim, apply the node's slice.

The standard library's HTTPS and nothing more: a Kubernetes client library (lightkube with httpx, or the official
one) would add several megabytes and more memory to an image that runs on every GPU node, for two requests.
The API server is ``KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT`` with the pod's token and CA, as every
in-cluster client finds it.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
TIMEOUT = 10.0


class ApiError(Exception):
    """A request the API server refused or did not answer; the message names the request and its status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InClusterApi:
    def __init__(self, host: str | None = None, account: str = ACCOUNT) -> None:
        if host is None:
            address = os.environ.get("KUBERNETES_SERVICE_HOST", "")
            if not address:
                raise ApiError("KUBERNETES_SERVICE_HOST is not set: the driver runs in a pod, with a ServiceAccount")
            address = f"[{address}]" if ":" in address else address  # an IPv6 address
            host = f"{address}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
        self.base = f"https://{host}"
        self.account = account
        self.context = ssl.create_default_context(cafile=os.path.join(account, "ca.crt"))

    def _token(self) -> str:  # read per request: the kubelet rotates the projected token
        with open(os.path.join(self.account, "token")) as handle:
            return handle.read().strip()

    def request(self, method: str, path: str, body: dict | None = None, content_type: str = "application/json",
                query: dict[str, str] | None = None) -> dict:
        url = self.base + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token()}", "Accept": "application/json", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT, context=self.context) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as error:
            try:
                detail = json.loads(error.read()).get("message", "")
            except (ValueError, AttributeError):
                detail = ""
            raise ApiError(f"{method} {path}: {error.code} {detail or error.reason}", error.code) from error
        except (urllib.error.URLError, OSError, TimeoutError) as error:
            raise ApiError(f"{method} {path}: {error}") from error

    def read_claim(self, namespace: str, name: str) -> dict:
        return self.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")

    def apply_slice(self, body: dict, manager: str) -> dict:
        """Server-side apply of a ResourceSlice (created, or updated to exactly this)."""
        name = body["metadata"]["name"]
        return self.request("PATCH", f"/apis/resource.k8s.io/v1/resourceslices/{name}", body,
                            "application/apply-patch+yaml", {"fieldManager": manager, "force": "true"})
