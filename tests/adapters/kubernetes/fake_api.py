"""A fake Kubernetes API server on loopback: lists and watches of nodes and pods, pod writes.

Enough of the real protocol for an informer: lists carry ``metadata.resourceVersion``; a watch
from version ``v`` streams every change after ``v`` as JSON lines and ends (as a server ends a
watch at its timeout); a version older than the compacted history answers an ``ERROR`` event
with status ``410 Gone``, as the API server does once etcd has compacted it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["FakeApiServer", "fake_api_server", "node_object", "pod_object"]


def node_object(
    name: str, *, cpu: str = "4", memory: str = "16Gi", **labels: str
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}},
    }


def pod_object(
    name: str,
    *,
    node: str | None = None,
    cpu: str = "500m",
    memory: str = "1Gi",
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": annotations or {}},
        "spec": spec,
        "status": {"phase": phase},
    }


class FakeApiServer:
    """The objects and their change history; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._version = 0
        self._objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._oldest = 0
        self.requests: list[str] = []
        self.url = ""

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (``ADDED`` or ``MODIFIED``)."""
        with self._lock:
            name = obj["metadata"]["name"]
            change = "MODIFIED" if name in self._objects[kind] else "ADDED"
            self._record(kind, change, obj)

    def delete(self, kind: str, name: str) -> bool:
        with self._lock:
            obj = self._objects[kind].get(name)
            if obj is None:
                return False
            self._record(kind, "DELETED", obj)
            return True

    def compact(self) -> None:
        """Forget the history so far: watches from older versions get 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest = self._version

    def _record(self, kind: str, change: str, obj: dict[str, Any]) -> None:
        self._version += 1
        stored = json.loads(json.dumps(obj))
        stored["metadata"]["resourceVersion"] = str(self._version)
        if change == "DELETED":
            self._objects[kind].pop(obj["metadata"]["name"], None)
        else:
            self._objects[kind][obj["metadata"]["name"]] = stored
        self._history.append((self._version, kind, change, stored))

    def list_body(self, kind: str) -> dict[str, Any]:
        with self._lock:
            return {
                "kind": "NodeList" if kind == "nodes" else "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._version)},
                "items": [self._objects[kind][n] for n in sorted(self._objects[kind])],
            }

    def watch_lines(self, kind: str, since: int) -> list[dict[str, Any]]:
        with self._lock:
            if since < self._oldest:
                status = {
                    "kind": "Status",
                    "code": 410,
                    "reason": "Expired",
                    "message": f"too old resource version: {since} ({self._oldest})",
                }
                return [{"type": "ERROR", "object": status}]
            return [
                {"type": change, "object": obj}
                for version, k, change, obj in self._history
                if k == kind and version > since
            ]


def _handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return None

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            kind = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods"}.get(url.path)
            api.requests.append(f"GET {self.path}")
            if kind is None:
                self._send(404, {"kind": "Status", "code": 404})
                return
            if query.get("watch", ["false"])[0] not in ("true", "1", "True"):
                self._send(200, api.list_body(kind))
                return
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            lines = b"".join(json.dumps(e).encode() + b"\n" for e in api.watch_lines(kind, since))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(lines)))
            self.end_headers()
            self.wfile.write(lines)

        def do_POST(self) -> None:
            api.requests.append(f"POST {self.path}")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = body["metadata"]["name"]
            if api.list_body("pods")["items"] and any(
                p["metadata"]["name"] == name for p in api.list_body("pods")["items"]
            ):
                self._send(409, {"kind": "Status", "code": 409, "reason": "AlreadyExists"})
                return
            body.setdefault("status", {"phase": "Pending"})
            api.put("pods", body)
            self._send(201, body)

        def do_DELETE(self) -> None:
            api.requests.append(f"DELETE {self.path}")
            name = self.path.rstrip("/").split("/")[-1]
            if not api.delete("pods", name):
                self._send(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            self._send(200, {"kind": "Status", "code": 200})

    return Handler


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    """A running fake API server; its ``url`` is ``http://127.0.0.1:<port>``."""
    api = FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="fake-k8s-api", daemon=True)
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
