"""A fake Kubernetes API server on loopback: what our adapters use of the real one.

* **Lists and watches** of nodes and pods (pods across namespaces), enough of the protocol for an
  informer: lists carry ``metadata.resourceVersion``; a watch from version ``v`` streams every
  change after ``v`` as JSON lines and ends (as a server ends a watch at its timeout); a version
  older than the compacted history answers an ``ERROR`` event with status ``410 Gone``, as the API
  server does once etcd has compacted it. A test can stall watches
  (:meth:`FakeApiServer.stall_watches`: headers, then an open connection without a byte) and make
  the next watch repeat old changes (:meth:`FakeApiServer.resend`: duplicated, out of order).
* **Namespaces**: pods and custom objects are stored by namespace and name, so the same name in
  two namespaces is two objects; nodes and priority classes are cluster-scoped.
* **Pods**: create (``201``; ``409 AlreadyExists``) through the priority admission plugin — a pod
  naming a PriorityClass that does not exist is ``403 Forbidden``, one whose ``spec.priority``
  differs from its class's value too; the plugin fills in ``priority`` and ``preemptionPolicy``
  (a pod without a class gets the global default class, else 0). Get (``404 NotFound``). Delete
  (``200`` with the pod; ``404 NotFound``) honours ``DeleteOptions.preconditions`` as the
  server's storage does: the ``uid``, then the ``resourceVersion``, each by equality; a mismatch
  is ``409 Conflict`` (reason ``Conflict``, "Precondition failed: ...").
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
* **Leases** (``coordination.k8s.io/v1``, namespaced): get (``404``), create (``201``; ``409
  AlreadyExists``), replace (``PUT``): the body's ``metadata.resourceVersion`` is required (a Lease
  allows no unconditional update: ``422``) and must be the stored one, else ``409 Conflict`` ("the
  object has been modified"), as optimistic concurrency on the API server; ``404`` for a Lease
  that does not exist (no create on update). ``spec.leaseDurationSeconds`` must be positive.

Errors are ``Status`` objects with the reason, message and details the API server sends. The
server assigns every object it stores a ``uid`` (kept by every update) and a ``resourceVersion``.
Every request is recorded (``requests``), and every body received (``bodies``) for tests to check
the wire. The endpoints are one table, :data:`ROUTES` (method, path pattern, answer): serving
another resource is adding its rows.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlparse

import jsonschema

__all__ = [
    "ROUTES",
    "FakeApiServer",
    "Request",
    "Route",
    "Served",
    "WatchStream",
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
_CLUSTER_SCOPED = frozenset({"nodes", "priorityclasses"})
"""Kinds stored by name alone; every other kind is namespaced (``namespace/name``)."""
_LONGEST_STALL_SECONDS = 60.0
"""A stalled watch is dropped after this long even if the test never releases it."""


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
    namespace: str = "default",
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
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
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


@dataclass(frozen=True)
class WatchStream:
    """A watch's answer: its event lines, or (``stall`` set) headers and then silence until
    ``stall`` is set."""

    lines: bytes
    stall: threading.Event | None = None


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
        self._stalls: dict[str, int] = {}
        self._unstall = threading.Event()
        self._resends: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[str] = []
        self.bodies: list[tuple[str, str, Any]] = []
        """``(method, path, body)`` of every request that carried a body."""
        self.url = ""

    # -- what the test does to the server ------------------------------------------------------

    def put(self, kind: str, obj: dict[str, Any]) -> None:
        """Create or replace an object (``ADDED`` or ``MODIFIED``), in the namespace its
        metadata names (``default`` if none) unless its kind is cluster-scoped."""
        with self._lock:
            metadata = obj["metadata"]
            key = _key(kind, metadata["name"], metadata.get("namespace"))
            change = "MODIFIED" if key in self._objects.setdefault(kind, {}) else "ADDED"
            self._record(kind, change, obj)

    def delete(self, kind: str, name: str, *, namespace: str | None = None) -> bool:
        """Delete an object (``DELETED``); ``namespace`` as for :meth:`get`."""
        with self._lock:
            key = self._find(kind, name, namespace)
            obj = self._objects.setdefault(kind, {}).get(key) if key is not None else None
            if obj is None:
                return False
            self._record(kind, "DELETED", obj)
            return True

    def get(self, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object (a copy), or ``None``. Without ``namespace``, the one object of
        that name in any namespace (an error if there are several)."""
        with self._lock:
            key = self._find(kind, name, namespace)
            obj = self._objects.setdefault(kind, {}).get(key) if key is not None else None
            return _copy(obj) if obj is not None else None

    def stall_watches(self, kind: str, *, count: int = 1) -> None:
        """The next ``count`` watches of ``kind`` get their headers and then nothing, the
        connection held open, until :meth:`release_stalls` (or the server stops)."""
        with self._lock:
            self._stalls[kind] = self._stalls.get(kind, 0) + count

    def release_stalls(self) -> None:
        """End every stalled watch (the server closes them)."""
        self._unstall.set()

    def resend(self, kind: str, *versions: int) -> None:
        """The next watch of ``kind`` sends the changes recorded at ``versions`` again after
        its own, in the order given: duplicated and out-of-order events."""
        with self._lock:
            recorded = {v: (change, obj) for v, k, change, obj in self._history if k == kind}
            self._resends.setdefault(kind, []).extend(
                {"type": recorded[v][0], "object": recorded[v][1]} for v in versions
            )

    def _find(self, kind: str, name: str, namespace: str | None) -> str | None:
        if kind in _CLUSTER_SCOPED or namespace is not None:
            return _key(kind, name, namespace)
        found = [k for k in self._objects.setdefault(kind, {}) if k.split("/", 1)[1] == name]
        if len(found) > 1:
            raise LookupError(f"{kind} {name!r} is in several namespaces: {found}; name one")
        return found[0] if found else None

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

    def set_status(
        self, kind: str, name: str, status: dict[str, Any], *, namespace: str | None = None
    ) -> None:
        """The operator writes the object's ``status`` (its status subresource)."""
        with self._lock:
            obj = self._objects.setdefault(kind, {})[str(self._find(kind, name, namespace))]
            self._record(kind, "MODIFIED", {**obj, "status": status})

    def remove_finalizer(
        self, kind: str, name: str, finalizer: str, *, namespace: str | None = None
    ) -> None:
        """A controller (the garbage collector, an operator) is done with the object; once it
        is being deleted and no finalizer is left, it is gone."""
        with self._lock:
            key = str(self._find(kind, name, namespace))
            obj = _copy(self._objects.setdefault(kind, {})[key])
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
        objects = self._objects.setdefault(kind, {})
        key = _key(kind, metadata["name"], metadata.get("namespace"))
        if change == "ADDED":
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", _TIMESTAMP)
        elif key in objects:
            # An object's uid never changes: an update that leaves it out keeps it.
            for field in ("uid", "creationTimestamp"):
                metadata.setdefault(field, objects[key]["metadata"].get(field))
        if kind not in _CLUSTER_SCOPED:
            metadata.setdefault("namespace", "default")
        if change == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = stored
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

    def watch_stream(self, kind: str, since: int) -> WatchStream:
        """The answer to a watch of ``kind`` from ``since``: its lines, or a stall."""
        with self._lock:
            if self._stalls.get(kind, 0) > 0:
                self._stalls[kind] -= 1
                return WatchStream(b"", self._unstall)
            events = self.watch_lines(kind, since) + self._resends.pop(kind, [])
        return WatchStream(b"".join(json.dumps(e).encode() + b"\n" for e in events))

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
            if _key("pods", name, namespace) in self._objects["pods"]:
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

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            pod = self._objects["pods"].get(_key("pods", name, namespace))
            if pod is None:
                raise _Refused(404, _not_found("pods", None, name))
            return _copy(pod)

    def delete_pod(self, namespace: str, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            pod = self._objects["pods"].get(_key("pods", name, namespace))
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
            if _key(served.key, name, namespace) in self._objects[served.key]:
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

    def get_custom(
        self, group: str, version: str, plural: str, name: str, namespace: str
    ) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            obj = self._objects[served.key].get(_key(served.key, name, namespace))
            if obj is None:
                raise _Refused(404, _not_found(plural, group, name))
            return _copy(obj)

    def list_custom(self, group: str, version: str, plural: str, namespace: str) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            objects = self._objects[served.key]
            return {
                "apiVersion": f"{group}/{version}",
                "kind": f"{served.kind}List",
                "metadata": {"resourceVersion": str(self._version)},
                "items": [objects[k] for k in sorted(objects) if k.startswith(f"{namespace}/")],
            }

    def delete_custom(
        self,
        group: str,
        version: str,
        plural: str,
        name: str,
        options: Mapping[str, Any],
        *,
        namespace: str,
    ) -> dict[str, Any]:
        with self._lock:
            served = self._resource(group, version, plural)
            obj = self._objects[served.key].get(_key(served.key, name, namespace))
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


def _key(kind: str, name: str, namespace: str | None) -> str:
    """Where an object is stored: ``namespace/name``, or its name if its kind is cluster-scoped
    (the same pod name in two namespaces is two pods)."""
    return name if kind in _CLUSTER_SCOPED else f"{namespace or 'default'}/{name}"


def _check_preconditions(
    obj: Mapping[str, Any], options: Mapping[str, Any], resource: str, name: str
) -> None:
    """``DeleteOptions.preconditions`` as the API server's storage checks them: the uid first,
    then the resource version, each by equality; a mismatch is ``409 Conflict``."""
    wanted = options.get("preconditions") or {}
    metadata = obj["metadata"]
    for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        expected, actual = wanted.get(field), metadata.get(field)
        if expected is not None and expected != actual:
            raise _Refused(
                409,
                status_body(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {resource} "{name}": Precondition failed: '
                    f"{label} in precondition: {expected}, {label} in object meta: {actual}",
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
_CLUSTER_LISTS = re.compile(r"^/api/v1/(?P<kind>nodes|pods)$")
_PODS = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods$")
_POD = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<name>[^/]+)$")
_PRIORITY_CLASSES = re.compile(r"^/apis/scheduling\.k8s\.io/v1/priorityclasses$")
_PRIORITY_CLASS = re.compile(r"^/apis/scheduling\.k8s\.io/v1/priorityclasses/(?P<name>[^/]+)$")
_LEASES = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<namespace>[^/]+)/leases$")
_LEASE = re.compile(
    r"^/apis/coordination\.k8s\.io/v1/namespaces/(?P<namespace>[^/]+)/leases/(?P<name>[^/]+)$"
)
_LEASE_RESOURCE = "leases.coordination.k8s.io"


@dataclass(frozen=True)
class Request:
    """What a route is handed: the path's named groups, the query (first value of each
    parameter) and the JSON body (``{}`` when there is none)."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    body: dict[str, Any]


@dataclass(frozen=True)
class Route:
    """One endpoint: ``answer`` returns the body sent with ``code`` (or a :class:`WatchStream`);
    a ``_Refused`` it raises is sent with its own code and ``Status``."""

    method: str
    pattern: re.Pattern[str]
    answer: Callable[[FakeApiServer, Request], Any]
    code: int = 200


def _list_or_watch(api: FakeApiServer, request: Request) -> Any:
    kind = request.path["kind"]
    if request.query.get("watch", "false") in ("true", "1", "True"):
        return api.watch_stream(kind, int(request.query.get("resourceVersion") or 0))
    return api.list_body(kind)


def _custom_collection(api: FakeApiServer, request: Request) -> Any:
    p = request.path
    if p["name"]:
        return api.get_custom(p["group"], p["version"], p["plural"], p["name"], p["namespace"])
    return api.list_custom(p["group"], p["version"], p["plural"], p["namespace"])


def _create_custom(api: FakeApiServer, request: Request) -> Any:
    p = request.path
    if p["name"]:
        raise _Refused(405, status_body(405, "MethodNotAllowed", "POST to a named object"))
    return api.create_custom(p["group"], p["version"], p["namespace"], p["plural"], request.body)


def _delete_custom(api: FakeApiServer, request: Request) -> Any:
    p = request.path
    if not p["name"]:
        raise _Refused(405, status_body(405, "MethodNotAllowed", "DELETE of a collection"))
    options = {**request.query, **request.body}
    return api.delete_custom(
        p["group"], p["version"], p["plural"], p["name"], options, namespace=p["namespace"]
    )


def _lease_problems(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    duration = (body.get("spec") or {}).get("leaseDurationSeconds")
    if duration is not None and (isinstance(duration, bool) or not isinstance(duration, int)):
        return [("spec.leaseDurationSeconds", f"must be an int32, got {duration!r}")]
    if duration is not None and duration <= 0:
        return [("spec.leaseDurationSeconds", "must be greater than 0")]
    return []


def _get_lease(api: FakeApiServer, request: Request) -> Any:
    name = request.path["name"]
    lease = api.get("leases", name, namespace=request.path["namespace"])
    if lease is None:
        raise _Refused(404, _not_found("leases", "coordination.k8s.io", name))
    return lease


def _create_lease(api: FakeApiServer, request: Request) -> Any:
    body, namespace = _copy(request.body), request.path["namespace"]
    name = (body.get("metadata") or {}).get("name") or ""
    problems = _lease_problems(body)
    if problems:
        raise _Refused(422, _invalid("leases", "coordination.k8s.io", name, problems))
    body["metadata"]["namespace"] = namespace
    with api._lock:
        if api.get("leases", name, namespace=namespace) is not None:
            message = f'{_LEASE_RESOURCE} "{name}" already exists'
            raise _Refused(
                409, status_body(409, "AlreadyExists", message, name=name, kind="leases")
            )
        body["metadata"].pop("resourceVersion", None)
        return api._record("leases", "ADDED", body)


def _replace_lease(api: FakeApiServer, request: Request) -> Any:
    body, namespace, name = _copy(request.body), request.path["namespace"], request.path["name"]
    metadata = body.setdefault("metadata", {})
    problems = _lease_problems(body)
    if not metadata.get("resourceVersion"):
        # The Lease strategy allows no unconditional update: the client must say which version
        # it read, so that two candidates cannot both take an expired lease.
        problems.append(("metadata.resourceVersion", "must be specified for an update"))
    if problems:
        raise _Refused(422, _invalid("leases", "coordination.k8s.io", name, problems))
    with api._lock:
        stored = api.get("leases", name, namespace=namespace)
        if stored is None:
            raise _Refused(404, _not_found("leases", "coordination.k8s.io", name))
        if metadata["resourceVersion"] != stored["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {_LEASE_RESOURCE} "{name}": the object has '
                "been modified; please apply your changes to the latest version and try again"
            )
            raise _Refused(409, status_body(409, "Conflict", message, name=name, kind="leases"))
        metadata["namespace"] = namespace
        return api._record("leases", "MODIFIED", body)


ROUTES: list[Route] = [
    Route("GET", _CLUSTER_LISTS, _list_or_watch),
    Route("GET", _POD, lambda api, r: api.get_pod(r.path["namespace"], r.path["name"])),
    Route("POST", _PODS, lambda api, r: api.create_pod(r.path["namespace"], r.body), 201),
    # Options may come as query parameters too; the body's win, as on the server.
    Route(
        "DELETE",
        _POD,
        lambda api, r: api.delete_pod(r.path["namespace"], r.path["name"], {**r.query, **r.body}),
    ),
    Route("GET", _PRIORITY_CLASS, lambda api, r: api.get_priority_class(r.path["name"])),
    Route("POST", _PRIORITY_CLASSES, lambda api, r: api.create_priority_class(r.body), 201),
    Route("GET", _LEASE, _get_lease),
    Route("POST", _LEASES, _create_lease, 201),
    Route("PUT", _LEASE, _replace_lease),
    # Custom objects last: their pattern matches any group's namespaced path, so a route for a
    # built-in namespaced resource of another group goes above this line.
    Route("GET", _CUSTOM, _custom_collection),
    Route("POST", _CUSTOM, _create_custom, 201),
    Route("DELETE", _CUSTOM, _delete_custom),
]
"""The endpoints, first match wins."""


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

        def _stream(self, watch: WatchStream) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if watch.stall is not None:
                # Headers, then silence on an open connection: what a client sees of a watch
                # behind a hung proxy or a dropped NAT entry (no RST, no data).
                self.end_headers()
                self.wfile.flush()
                watch.stall.wait(_LONGEST_STALL_SECONDS)
                return
            self.send_header("Content-Length", str(len(watch.lines)))
            self.end_headers()
            self.wfile.write(watch.lines)

        def _dispatch(self, method: str) -> None:
            api.requests.append(f"{method} {self.path}")
            url = urlparse(self.path)
            body = self._body(method, url.path) if method != "GET" else {}
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            for route in ROUTES:
                if route.method != method or not (match := route.pattern.match(url.path)):
                    continue
                try:
                    answer = route.answer(api, Request(match.groupdict(), query, body))
                except _Refused as refused:
                    self._send(refused.code, refused.body)
                    return
                if isinstance(answer, WatchStream):
                    self._stream(answer)
                else:
                    self._send(route.code, answer)
                return
            if method == "GET":
                message = "the server could not find the requested resource"
                self._send(404, status_body(404, "NotFound", message))
            else:
                self._send(405, status_body(405, "MethodNotAllowed", f"{method} {url.path}"))

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_PATCH(self) -> None:
            self._dispatch("PATCH")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

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
        api.release_stalls()
        server.shutdown()
        server.server_close()
        thread.join(5)
