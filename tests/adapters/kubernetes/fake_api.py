"""A fake Kubernetes API server on loopback: what our adapters use of the real one.

* **Lists and watches** of nodes and pods, enough of the protocol for an informer: lists carry
  ``metadata.resourceVersion``; a watch from version ``v`` streams every change after ``v`` as JSON
  lines and ends (as a server ends a watch at its timeout); a version older than the compacted
  history answers an ``ERROR`` event with status ``410 Gone``, as the API server does once etcd
  has compacted it.
* **Pods**: create (``201``; ``409 AlreadyExists``) through the priority admission plugin — a pod
  naming a PriorityClass that does not exist is ``403 Forbidden``, one whose ``spec.priority``
  differs from its class's value too; the plugin fills in ``priority`` and ``preemptionPolicy``
  (a pod without a class gets the global default class, else 0). Delete (``200`` with the pod;
  ``404 NotFound``) honours a ``DeleteOptions`` uid precondition: another uid is ``409 Conflict``.
* **PriorityClasses** (``scheduling.k8s.io/v1``): create with the API's validation (``value``
  required and an int32, user values at most one billion, the ``system-`` prefix reserved, one
  global default, ``preemptionPolicy`` one of two values: else ``422 Invalid``), ``409`` when the
  name is taken, get.
* **Custom objects** of the resources a test serves (:meth:`FakeApiServer.serve`, as installing a
  CRD does): create (``201``; ``409``; ``400`` for a kind or namespace that does not match the
  request; ``422`` when the object fails the resource's schema; the ``status`` of a created object
  is dropped, since both operators' CRDs have a status subresource), get and list (``404`` for a
  resource nobody serves, as for an uninstalled CRD), delete (``200`` with the object). Deleting
  with ``propagationPolicy: Foreground`` adds the ``foregroundDeletion`` finalizer; an object with
  finalizers only gets a ``deletionTimestamp`` and stays until the test, playing the garbage
  collector or the operator, removes them (:meth:`FakeApiServer.remove_finalizer`). The test plays
  the operator writing ``status`` (:meth:`FakeApiServer.set_status`).

Errors are ``Status`` objects with the reason, message and details the API server sends. The
server assigns every object it stores a ``uid`` and a ``resourceVersion``. Every request is
recorded (``requests``), and every body received (``bodies``) for tests to check the wire.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import jsonschema

__all__ = [
    "FakeApiServer",
    "Served",
    "fake_api_server",
    "node_object",
    "pod_object",
    "status_body",
]

_INT32 = (-(2**31), 2**31 - 1)
_HIGHEST_USER_PRIORITY = 1_000_000_000
_SYSTEM_PRIORITY_CLASSES = {
    "system-cluster-critical": 2_000_000_000,
    "system-node-critical": 2_000_001_000,
}
_PREEMPTION_POLICIES = ("PreemptLowerPriority", "Never")
_TIMESTAMP = "2025-01-01T00:00:00Z"


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    """A deep copy, through JSON as the wire would make it."""
    return cast(dict[str, Any], json.loads(json.dumps(obj)))


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


def status_body(
    code: int,
    reason: str,
    message: str,
    *,
    name: str | None = None,
    group: str | None = None,
    kind: str | None = None,
    causes: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A failure ``Status``, as the API server answers errors."""
    details: dict[str, Any] = {}
    for key, value in (("name", name), ("group", group), ("kind", kind)):
        if value:
            details[key] = value
    if causes:
        details["causes"] = causes
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


@dataclass(frozen=True)
class Served:
    """A custom resource the server serves (an installed CRD)."""

    group: str
    version: str
    plural: str
    kind: str
    schema: Mapping[str, Any] | None = None
    """The object's schema (JSON schema); ``None`` accepts any object."""

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}"


class _Refused(Exception):
    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("message"))
        self.code = code
        self.body = body


class FakeApiServer:
    """The objects and their change history; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._version = 0
        self._objects: dict[str, dict[str, dict[str, Any]]] = {
            "nodes": {},
            "pods": {},
            "priorityclasses": {},
        }
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []
        self._oldest = 0
        self._served: dict[tuple[str, str, str], Served] = {}
        self.requests: list[str] = []
        self.bodies: list[tuple[str, str, Any]] = []
        """``(method, path, body)`` of every request that carried a body."""
        self.url = ""

    # -- what the test does to the server ------------------------------------------------------

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (``ADDED`` or ``MODIFIED``)."""
        with self._lock:
            name = obj["metadata"]["name"]
            change = "MODIFIED" if name in self._objects.setdefault(kind, {}) else "ADDED"
            self._record(kind, change, obj)

    def delete(self, kind: str, name: str) -> bool:
        with self._lock:
            obj = self._objects.setdefault(kind, {}).get(name)
            if obj is None:
                return False
            self._record(kind, "DELETED", obj)
            return True

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The stored object (a copy), or ``None``."""
        with self._lock:
            obj = self._objects.setdefault(kind, {}).get(name)
            return _copy(obj) if obj is not None else None

    def compact(self) -> None:
        """Forget the history so far: watches from older versions get 410 Gone."""
        with self._lock:
            self._history.clear()
            self._oldest = self._version

    def serve(self, resource: Served) -> None:
        """Serve a custom resource, as installing its CRD does."""
        with self._lock:
            self._served[(resource.group, resource.version, resource.plural)] = resource
            self._objects.setdefault(resource.key, {})

    def set_status(self, kind: str, name: str, status: dict[str, Any]) -> None:
        """The operator writes the object's ``status`` (its status subresource)."""
        with self._lock:
            obj = self._objects.setdefault(kind, {})[name]
            self._record(kind, "MODIFIED", {**obj, "status": status})

    def remove_finalizer(self, kind: str, name: str, finalizer: str) -> None:
        """A controller (the garbage collector, an operator) is done with the object; once it
        is being deleted and no finalizer is left, it is gone."""
        with self._lock:
            obj = _copy(self._objects.setdefault(kind, {})[name])
            metadata = obj["metadata"]
            metadata["finalizers"] = [f for f in metadata.get("finalizers", []) if f != finalizer]
            if metadata.get("deletionTimestamp") and not metadata["finalizers"]:
                self._record(kind, "DELETED", obj)
            else:
                self._record(kind, "MODIFIED", obj)

    # -- storage ---------------------------------------------------------------------------------

    def _record(self, kind: str, change: str, obj: dict[str, Any]) -> dict[str, Any]:
        self._version += 1
        stored = _copy(obj)
        metadata = stored.setdefault("metadata", {})
        metadata["resourceVersion"] = str(self._version)
        if change == "ADDED":
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", _TIMESTAMP)
        objects = self._objects.setdefault(kind, {})
        if change == "DELETED":
            objects.pop(metadata["name"], None)
        else:
            objects[metadata["name"]] = stored
        self._history.append((self._version, kind, change, stored))
        return _copy(stored)

    def list_body(self, kind: str) -> dict[str, Any]:
        with self._lock:
            objects = self._objects.setdefault(kind, {})
            return {
                "kind": "NodeList" if kind == "nodes" else "PodList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(self._version)},
                "items": [objects[n] for n in sorted(objects)],
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

    # -- pods ------------------------------------------------------------------------------------

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            name = body["metadata"]["name"]
            if name in self._objects["pods"]:
                raise _Refused(
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        f'pods "{name}" already exists',
                        name=name,
                        kind="pods",
                    ),
                )
            pod = _copy(body)
            pod["metadata"]["namespace"] = namespace
            self._admit_priority(pod)
            pod.setdefault("status", {"phase": "Pending"})
            return self._record("pods", "ADDED", pod)

    def _admit_priority(self, pod: dict[str, Any]) -> None:
        spec = pod.setdefault("spec", {})
        name = pod["metadata"]["name"]
        class_name = spec.get("priorityClassName") or ""
        classes = self._priority_classes()
        if class_name:
            if class_name not in classes:
                raise _forbidden(name, f"no PriorityClass with name {class_name} was found")
            value, policy = classes[class_name]
        else:
            defaults = sorted(
                (pc["value"], n)
                for n, pc in self._objects["priorityclasses"].items()
                if pc.get("globalDefault")
            )
            if defaults:
                class_name = defaults[0][1]
                value, policy = classes[class_name]
            else:
                value, policy = 0, "PreemptLowerPriority"
        if "priority" in spec and spec["priority"] != value:
            raise _forbidden(
                name,
                f"the integer value of priority ({spec['priority']}) must not be provided in pod "
                f"spec; priority admission controller computed {value} from the given "
                "PriorityClass name",
            )
        if "preemptionPolicy" in spec and spec["preemptionPolicy"] != policy:
            raise _forbidden(
                name,
                f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not be "
                f"provided in pod spec; priority admission controller computed {policy} from "
                "the given PriorityClass name",
            )
        if class_name:
            spec["priorityClassName"] = class_name
        spec["priority"] = value
        spec["preemptionPolicy"] = policy

    def _priority_classes(self) -> dict[str, tuple[int, str]]:
        classes = {n: (v, "PreemptLowerPriority") for n, v in _SYSTEM_PRIORITY_CLASSES.items()}
        for name, pc in self._objects["priorityclasses"].items():
            classes[name] = (pc["value"], pc.get("preemptionPolicy", "PreemptLowerPriority"))
        return classes

    def delete_pod(self, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            pod = self._objects["pods"].get(name)
            if pod is None:
                raise _Refused(404, _not_found("pods", None, name))
            _check_preconditions(pod, options, "pods", name)
            return self._record("pods", "DELETED", pod)

    # -- priority classes ------------------------------------------------------------------------

    def create_priority_class(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            name = (body.get("metadata") or {}).get("name", "")
            problems = _priority_class_problems(body)
            default = [
                n for n, pc in self._objects["priorityclasses"].items() if pc.get("globalDefault")
            ]
            if body.get("globalDefault") is True and default:
                problems.append(
                    ("globalDefault", f"globalDefault must be false: {default[0]} is the default")
                )
            if problems:
                raise _Refused(422, _invalid("PriorityClass", "scheduling.k8s.io", name, problems))
            if name in self._objects["priorityclasses"] or name in _SYSTEM_PRIORITY_CLASSES:
                raise _Refused(
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        f'priorityclasses.scheduling.k8s.io "{name}" already exists',
                        name=name,
                        group="scheduling.k8s.io",
                        kind="priorityclasses",
                    ),
                )
            stored = _copy(body)
            stored.setdefault("preemptionPolicy", "PreemptLowerPriority")
            return self._record("priorityclasses", "ADDED", stored)

    def get_priority_class(self, name: str) -> dict[str, Any]:
        with self._lock:
            if name in _SYSTEM_PRIORITY_CLASSES:
                return {
                    "apiVersion": "scheduling.k8s.io/v1",
                    "kind": "PriorityClass",
                    "metadata": {"name": name},
                    "value": _SYSTEM_PRIORITY_CLASSES[name],
                }
            pc = self._objects["priorityclasses"].get(name)
            if pc is None:
                raise _Refused(404, _not_found("priorityclasses", "scheduling.k8s.io", name))
            return _copy(pc)

    # -- custom objects --------------------------------------------------------------------------

    def _resource(self, group: str, version: str, plural: str) -> Served:
        served = self._served.get((group, version, plural))
        if served is None:
            raise _Refused(
                404,
                status_body(404, "NotFound", "the server could not find the requested resource"),
            )
        return served

    def create_custom(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            metadata = body.get("metadata") or {}
            name = metadata.get("name", "")
            if body.get("apiVersion") != f"{group}/{version}" or body.get("kind") != served.kind:
                raise _Refused(
                    400,
                    status_body(
                        400,
                        "BadRequest",
                        f"the API version in the data ({body.get('apiVersion')}) and kind "
                        f"({body.get('kind')}) do not match the request's "
                        f"{group}/{version} {served.kind}",
                    ),
                )
            if metadata.get("namespace", namespace) != namespace:
                raise _Refused(
                    400,
                    status_body(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent "
                        "on the request",
                    ),
                )
            if served.schema is not None:
                validator = jsonschema.Draft202012Validator(served.schema)
                problems = [
                    (".".join(str(p) for p in e.absolute_path) or "<root>", e.message)
                    for e in sorted(validator.iter_errors(body), key=lambda e: list(e.path))
                ]
                if problems:
                    raise _Refused(422, _invalid(served.kind, group, name, problems))
            if name in self._objects[served.key]:
                raise _Refused(
                    409,
                    status_body(
                        409,
                        "AlreadyExists",
                        f'{served.key} "{name}" already exists',
                        name=name,
                        group=group,
                        kind=plural,
                    ),
                )
            stored = _copy(body)
            stored.pop("status", None)
            stored["metadata"]["namespace"] = namespace
            stored["metadata"]["generation"] = 1
            return self._record(served.key, "ADDED", stored)

    def get_custom(self, group: str, version: str, plural: str, name: str) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            obj = self._objects[served.key].get(name)
            if obj is None:
                raise _Refused(404, _not_found(plural, group, name))
            return _copy(obj)

    def list_custom(self, group: str, version: str, plural: str) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            objects = self._objects[served.key]
            return {
                "apiVersion": f"{group}/{version}",
                "kind": f"{served.kind}List",
                "metadata": {"resourceVersion": str(self._version)},
                "items": [objects[n] for n in sorted(objects)],
            }

    def delete_custom(
        self, group: str, version: str, plural: str, name: str, options: Mapping[str, Any]
    ) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            obj = self._objects[served.key].get(name)
            if obj is None:
                raise _Refused(404, _not_found(plural, group, name))
            _check_preconditions(obj, options, served.key, name)
            updated = _copy(obj)
            metadata = updated["metadata"]
            finalizers = list(metadata.get("finalizers", []))
            if options.get("propagationPolicy") == "Foreground" and not metadata.get(
                "deletionTimestamp"
            ):
                finalizers.append("foregroundDeletion")
            if not finalizers:
                return self._record(served.key, "DELETED", updated)
            if metadata.get("deletionTimestamp"):
                return updated
            metadata["finalizers"] = finalizers
            metadata["deletionTimestamp"] = _TIMESTAMP
            return self._record(served.key, "MODIFIED", updated)


def _forbidden(name: str, reason: str) -> _Refused:
    return _Refused(
        403,
        status_body(
            403, "Forbidden", f'pods "{name}" is forbidden: {reason}', name=name, kind="pods"
        ),
    )


def _not_found(plural: str, group: str | None, name: str) -> dict[str, Any]:
    resource = f"{plural}.{group}" if group else plural
    return status_body(
        404, "NotFound", f'{resource} "{name}" not found', name=name, group=group, kind=plural
    )


def _invalid(kind: str, group: str, name: str, problems: list[tuple[str, str]]) -> dict[str, Any]:
    text = ", ".join(f"{field}: {reason}" for field, reason in problems)
    return status_body(
        422,
        "Invalid",
        f'{kind}.{group} "{name}" is invalid: {text}',
        name=name,
        group=group,
        kind=kind,
        causes=[
            {"reason": "FieldValueInvalid", "message": reason, "field": field}
            for field, reason in problems
        ],
    )


def _check_preconditions(
    obj: Mapping[str, Any], options: Mapping[str, Any], resource: str, name: str
) -> None:
    wanted = (options.get("preconditions") or {}).get("uid")
    actual = obj["metadata"].get("uid")
    if wanted is not None and wanted != actual:
        raise _Refused(
            409,
            status_body(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                f"UID in precondition: {wanted}, UID in object meta: {actual}",
                name=name,
                kind=resource,
            ),
        )


def _priority_class_problems(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    name = (body.get("metadata") or {}).get("name") or ""
    if not name:
        problems.append(("metadata.name", "Required value"))
    elif name.startswith("system-"):
        problems.append(("metadata.name", "priority class names with 'system-' are reserved"))
    value = body.get("value")
    if value is None:
        problems.append(("value", "Required value"))
    elif isinstance(value, bool) or not isinstance(value, int):
        problems.append(("value", f"must be an int32, got {value!r}"))
    elif not _INT32[0] <= value <= _INT32[1]:
        problems.append(("value", f"must be an int32, got {value}"))
    elif value > _HIGHEST_USER_PRIORITY:
        problems.append(("value", f"must not be greater than {_HIGHEST_USER_PRIORITY}"))
    default = body.get("globalDefault", False)
    if not isinstance(default, bool):
        problems.append(("globalDefault", f"must be a boolean, got {default!r}"))
    policy = body.get("preemptionPolicy", "PreemptLowerPriority")
    if policy not in _PREEMPTION_POLICIES:
        problems.append(("preemptionPolicy", f"Unsupported value: {policy!r}"))
    return problems


_CUSTOM = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)/namespaces/(?P<namespace>[^/]+)/"
    r"(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?$"
)
_PODS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods(?:/(?P<name>[^/]+))?$")
_PRIORITY_CLASSES = re.compile(
    r"^/apis/scheduling\.k8s\.io/v1/priorityclasses(?:/(?P<name>[^/]+))?$"
)


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

        def _body(self, method: str, path: str) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body: dict[str, Any] = json.loads(raw) if raw.strip() else {}
            if raw:
                api.bodies.append((method, path, body))
            return body

        def _answer(self, call: Any, code: int = 200) -> None:
            try:
                self._send(code, call())
            except _Refused as refused:
                self._send(refused.code, refused.body)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            query = parse_qs(url.query)
            api.requests.append(f"GET {self.path}")
            if (match := _PRIORITY_CLASSES.match(url.path)) and match["name"]:
                self._answer(lambda: api.get_priority_class(match["name"]))
                return
            if match := _CUSTOM.match(url.path):
                group, version, plural, name = (
                    match["group"],
                    match["version"],
                    match["plural"],
                    match["name"],
                )
                if name:
                    self._answer(lambda: api.get_custom(group, version, plural, name))
                else:
                    self._answer(lambda: api.list_custom(group, version, plural))
                return
            kind = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods"}.get(url.path)
            if kind is None:
                self._send(
                    404,
                    status_body(
                        404, "NotFound", "the server could not find the requested resource"
                    ),
                )
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
            path = urlparse(self.path).path
            body = self._body("POST", path)
            if match := _PODS.match(path):
                namespace = match["namespace"]
                self._answer(lambda: api.create_pod(namespace, body), 201)
            elif _PRIORITY_CLASSES.match(path):
                self._answer(lambda: api.create_priority_class(body), 201)
            elif match := _CUSTOM.match(path):
                group, version, namespace, plural = (
                    match["group"],
                    match["version"],
                    match["namespace"],
                    match["plural"],
                )
                self._answer(
                    lambda: api.create_custom(group, version, namespace, plural, body), 201
                )
            else:
                self._send(405, status_body(405, "MethodNotAllowed", f"POST {path}"))

        def do_DELETE(self) -> None:
            api.requests.append(f"DELETE {self.path}")
            url = urlparse(self.path)
            body = self._body("DELETE", url.path)
            # Options may come as query parameters too; the body's win, as on the server.
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            options = {**query, **body}
            if (match := _PODS.match(url.path)) and match["name"]:
                name = match["name"]
                self._answer(lambda: api.delete_pod(name, options))
            elif (match := _CUSTOM.match(url.path)) and match["name"]:
                group, version, plural, name = (
                    match["group"],
                    match["version"],
                    match["plural"],
                    match["name"],
                )
                self._answer(lambda: api.delete_custom(group, version, plural, name, options))
            else:
                self._send(405, status_body(405, "MethodNotAllowed", f"DELETE {url.path}"))

    return Handler


@contextmanager
def fake_api_server() -> Iterator[FakeApiServer]:
    """A running fake API server; its ``url`` is ``http://127.0.0.1:<port>``."""
    api = FakeApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
    api.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll so shutting the server down at a test's end does not wait half a second.
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.02},
        name="fake-k8s-api",
        daemon=True,
    )
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
