"""The Kubernetes API calls fleetledger's source makes, found in the source itself, and whether
an RBAC configuration grants them.

:func:`api_calls` parses a module (``ast``) for the official client's API classes
(``client.CoreV1Api(...)``, kept in a variable or an attribute) and every method of theirs it
calls or hands on (an informer is given ``self._core.list_node`` uncalled). :func:`permissions`
turns a call into what RBAC must allow, by the client's own conventions: the resource and its
group come from the request path the generated method sends (``/api/v1/namespaces/{namespace}/
pods`` is ``pods`` in the core group, addressed in a namespace), and the verb from the method's
name (``list_`` is list and watch — the informers watch through the same function — ``create_``
create, ``delete_`` delete, ``read_`` and ``get_`` get, ``replace_`` update, ``patch_`` patch).
``CustomObjectsApi`` paths leave the group and plural to the call's arguments: string literals
there are used, anything else stands for every custom resource the code declares.

:func:`uncovered` then names the permissions a service account is not granted by the Roles and
ClusterRoles bound to it, with RBAC's own rules: a rule's ``resourceNames`` cannot allow
``list``, ``watch`` or ``create``, and a permission outside any namespace needs a ClusterRole
bound cluster-wide.
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

__all__ = [
    "ApiCall",
    "Grant",
    "Permission",
    "api_calls",
    "grants",
    "permissions",
    "scan",
    "uncovered",
]

_VERBS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("list_", ("list", "watch")),
    ("watch_", ("watch",)),
    ("create_", ("create",)),
    ("delete_collection_", ("deletecollection",)),
    ("delete_", ("delete",)),
    ("read_", ("get",)),
    ("get_", ("get",)),
    ("replace_", ("update",)),
    ("patch_", ("patch",)),
)
# The verbs RBAC can narrow by resourceNames (it cannot for list, watch or create).
_NAMED_VERBS = {"get", "update", "patch", "delete"}
_PATH = re.compile(r"""['"](/apis?/[^'"]*)['"]""")


@dataclass(frozen=True, slots=True, order=True)
class Permission:
    """What RBAC must allow: ``verb`` on ``resource`` (``pods``, ``pods/status``) of ``group``;
    ``namespaced``: addressed within a namespace, so a Role there suffices."""

    group: str
    resource: str
    verb: str
    namespaced: bool


@dataclass(frozen=True, slots=True)
class ApiCall:
    """``api.method`` referenced at ``where``; ``literals`` are its string-literal arguments by
    parameter name (``group``, ``plural`` for custom objects)."""

    api: str
    method: str
    where: str
    literals: tuple[tuple[str, str], ...] = ()


@functools.cache
def _api_classes() -> frozenset[str]:
    # By name only: importing every API class of the client takes seconds.
    return frozenset(name for name in dir(client) if name.endswith("Api"))


def _class_named(node: ast.expr) -> str | None:
    """The API class ``node`` constructs (``client.CoreV1Api(x)``, ``CoreV1Api()``), if any."""
    if not isinstance(node, ast.Call):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name if name in _api_classes() else None


def api_calls(source: str, filename: str = "<source>") -> list[ApiCall]:
    """Every API-class method ``source`` calls or references, in source order."""
    # Only a module that constructs an API class can call one (receivers are resolved from the
    # constructions): the others need no parsing.
    if not any(name in source for name in _api_classes()):
        return []
    tree = ast.parse(source, filename)
    nodes = list(ast.walk(tree))
    names: dict[str, str] = {}
    attributes: dict[str, str] = {}
    for node in nodes:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        constructed = _class_named(value)
        if constructed is None:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                names[target.id] = constructed
            elif isinstance(target, ast.Attribute):
                attributes[target.attr] = constructed
    calls_by_func = {id(node.func): node for node in nodes if isinstance(node, ast.Call)}
    found: list[ApiCall] = []
    for node in nodes:
        if not isinstance(node, ast.Attribute):
            continue
        receiver = node.value
        if isinstance(receiver, ast.Name):
            api = names.get(receiver.id)
        elif isinstance(receiver, ast.Attribute):
            api = attributes.get(receiver.attr)
        else:
            api = _class_named(receiver)
        method = node.attr.removesuffix("_with_http_info")
        if api is None or method.startswith("_") or not hasattr(getattr(client, api), method):
            continue
        call = calls_by_func.get(id(node))
        literals = _literals(getattr(client, api), method, call) if call is not None else ()
        found.append(ApiCall(api, method, f"{filename}:{node.lineno}", literals))
    return sorted(found, key=_position)


def _position(call: ApiCall) -> tuple[str, int]:
    path, _, line = call.where.rpartition(":")
    return path, int(line)


def _literals(api: Any, method: str, call: ast.Call) -> tuple[tuple[str, str], ...]:
    parameters = [p for p in inspect.signature(getattr(api, method)).parameters if p != "self"]
    bound: dict[str, ast.expr] = dict(zip(parameters, call.args, strict=False))
    bound.update({k.arg: k.value for k in call.keywords if k.arg is not None})
    return tuple(
        sorted(
            (name, node.value)
            for name, node in bound.items()
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
    )


def scan(root: Path) -> list[ApiCall]:
    """Every API call in the Python modules under ``root``."""
    return [
        call
        for path in sorted(root.rglob("*.py"))
        for call in api_calls(path.read_text(encoding="utf-8"), str(path.relative_to(root.parent)))
    ]


@functools.cache
def _request_path(api: str, method: str) -> str:
    """The request path ``api.method`` sends, from the generated client's source (the request
    is built in ``_<method>_serialize`` in the pydantic generation, ``<method>_with_http_info``
    before it)."""
    cls = getattr(client, api)
    for name in (f"_{method}_serialize", f"{method}_with_http_info"):
        function = getattr(cls, name, None)
        if function is not None:
            match = _PATH.search(inspect.getsource(function))
            if match is not None:
                return match.group(1)
    raise LookupError(f"no request path found for {api}.{method}")


def _verbs(method: str) -> tuple[str, ...]:
    for prefix, verbs in _VERBS:
        if method.startswith(prefix):
            return verbs
    raise LookupError(f"{method}: no RBAC verb for this kind of call; extend _VERBS")


def permissions(call: ApiCall, custom_resources: Iterable[tuple[str, str]] = ()) -> set[Permission]:
    """What RBAC must allow for ``call``; ``custom_resources`` are the ``(group, plural)`` a
    custom-object call without literal ones may address."""
    parts = _request_path(call.api, call.method).strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    namespaced = len(rest) >= 3 and rest[0] == "namespaces" and rest[1] == "{namespace}"
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    literals = dict(call.literals)
    targets = [(group, resource)]
    if group == "{group}" or resource.startswith("{plural}"):
        if "group" in literals and "plural" in literals:
            targets = [(literals["group"], literals["plural"])]
        else:
            targets = list(custom_resources)
            if not targets:
                raise LookupError(f"{call.where}: a custom-object call but no custom resources")
        suffix = resource.partition("/")[2]
        targets = [(g, p + (f"/{suffix}" if suffix else "")) for g, p in targets]
    return {Permission(g, r, verb, namespaced) for g, r in targets for verb in _verbs(call.method)}


@dataclass(frozen=True, slots=True)
class Grant:
    """A rule bound to the subject; ``namespace`` None: cluster-wide."""

    rule: Mapping[str, Any]
    namespace: str | None

    def allows(self, permission: Permission) -> bool:
        rule = self.rule
        if rule.get("resourceNames") and permission.verb not in _NAMED_VERBS:
            return False
        return (
            _matches(rule.get("apiGroups", []), permission.group)
            and _matches(rule.get("resources", []), permission.resource)
            and _matches(rule.get("verbs", []), permission.verb)
        )


def _matches(allowed: list[str], value: str) -> bool:
    return "*" in allowed or value in allowed


def grants(objects: Iterable[Mapping[str, Any]], namespace: str, name: str) -> list[Grant]:
    """The rules bound to the service account ``namespace/name``."""
    objects = list(objects)
    roles = {
        (o["metadata"].get("namespace"), o["metadata"]["name"]): o.get("rules", [])
        for o in objects
        if o["kind"] in ("Role", "ClusterRole")
    }
    found: list[Grant] = []
    for binding in objects:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == name
            and s.get("namespace") == namespace
            for s in binding.get("subjects", [])
        ):
            continue
        where = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        ref = binding["roleRef"]
        role_namespace = where if ref["kind"] == "Role" else None
        for rule in roles.get((role_namespace, ref["name"]), []):
            found.append(Grant(rule, where))
    return found


def uncovered(required: Iterable[Permission], granted: list[Grant]) -> set[Permission]:
    """The permissions in ``required`` that no grant allows (a permission outside namespaces
    needs a cluster-wide grant)."""
    return {
        p
        for p in required
        if not any(g.allows(p) and (p.namespaced or g.namespace is None) for g in granted)
    }
