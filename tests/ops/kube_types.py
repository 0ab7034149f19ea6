"""Manifests checked against the Kubernetes API types, through the official client's generated
models, and custom kinds against schemas written down from their CRDs.

A kind is looked up where the client serves it: ``apiVersion`` ``apps/v1`` is the ``AppsV1Api``
class, which must have ``create_namespaced_deployment`` (a namespaced kind) or ``create_<kind>``
(a cluster-scoped one); its model class (``V1Deployment``) is then walked recursively through
``openapi_types`` (each attribute's type: ``str``, ``int``, ``bool``, ``object``, ``List[T]``,
``Dict[str, T]``, or a model) and ``attribute_map`` (the attribute's JSON name). A field the
model does not have is reported, and so is a missing required one. The client's generations
declare "required" differently: the pydantic models (the generation installed here, 37) have
fields without a default (``model_fields[name].is_required()``); the older ones raise
``ValueError("Invalid value for `name`, must not be `None`")`` from the attribute's setter under
client-side validation. Both are read here, so the check holds across the versions pyproject
allows.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
from kubernetes import client

__all__ = [
    "SERVICE_MONITOR_SCHEMA",
    "api_class",
    "is_namespaced",
    "model_class",
    "problems",
    "required_attributes",
    "service_monitor_problems",
]

_LIST = re.compile(r"^(?:List\[|list\[)(.+)\]$")
_DICT = re.compile(r"^(?:Dict\[str, |dict\(str, )(.+)[\])]$")
_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    "bytearray": (str,),
}


def api_class(api_version: str) -> Any:
    """The client's API class serving ``api_version`` (``CoreV1Api`` for ``v1``)."""
    group, _, version = api_version.rpartition("/")
    words = group.removesuffix(".k8s.io").split(".") if group else ["core"]
    name = "".join(w.capitalize() for w in words) + version.capitalize() + "Api"
    found = getattr(client, name, None)
    if found is None:
        raise LookupError(f"the client serves no {api_version} ({name})")
    return found


def _snake(kind: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", kind).lower()


def is_namespaced(api_version: str, kind: str) -> bool:
    """Whether ``kind`` is namespaced, as its API class's create method says; LookupError if
    the group does not serve the kind at all."""
    api = api_class(api_version)
    if hasattr(api, f"create_namespaced_{_snake(kind)}"):
        return True
    if hasattr(api, f"create_{_snake(kind)}"):
        return False
    raise LookupError(f"{api.__name__} serves no {kind}")


def model_class(api_version: str, kind: str) -> Any:
    """The generated model of ``kind`` in ``api_version`` (``V1Deployment``)."""
    is_namespaced(api_version, kind)
    version = api_version.rpartition("/")[2]
    return getattr(client, version.capitalize() + kind)


@functools.cache
def required_attributes(model: Any) -> frozenset[str]:
    """The attributes (Python names) ``model`` cannot be without."""
    fields = getattr(model, "model_fields", None)
    if fields is not None:
        return frozenset(name for name, field in fields.items() if field.is_required())
    instance = model.__new__(model)
    instance.local_vars_configuration = client.Configuration()
    required = set()
    for name in model.openapi_types:
        try:
            setattr(instance, name, None)
        except ValueError as e:
            if "must not be `None`" in str(e):
                required.add(name)
    return frozenset(required)


def problems(obj: dict[str, Any]) -> list[str]:
    """What in ``obj`` its kind's model refuses: unknown fields, missing required fields,
    values of the wrong type (empty if none)."""
    found: list[str] = []
    _check(obj, model_class(obj["apiVersion"], obj["kind"]).__name__, obj["kind"], found)
    return found


def _check(value: Any, type_name: str, path: str, found: list[str]) -> None:
    if type_name == "object":
        return
    if (match := _LIST.match(type_name)) is not None:
        if not isinstance(value, list):
            found.append(f"{path}: a list expected, got {value!r}")
            return
        for i, item in enumerate(value):
            _check(item, match.group(1), f"{path}[{i}]", found)
        return
    if (match := _DICT.match(type_name)) is not None:
        if not isinstance(value, dict):
            found.append(f"{path}: a mapping expected, got {value!r}")
            return
        for key, item in value.items():
            _check(item, match.group(1), f"{path}.{key}", found)
        return
    if type_name in _SCALARS:
        wanted = _SCALARS[type_name]
        if not isinstance(value, wanted) or (bool not in wanted and isinstance(value, bool)):
            found.append(f"{path}: {type_name} expected, got {value!r}")
        return
    _check_model(value, getattr(client, type_name), path, found)


def _check_model(value: Any, model: Any, path: str, found: list[str]) -> None:
    if not isinstance(value, dict):
        found.append(f"{path}: a {model.__name__} mapping expected, got {value!r}")
        return
    attribute_of = {json_name: name for name, json_name in model.attribute_map.items()}
    for key, item in value.items():
        if key not in attribute_of:
            found.append(f"{path}.{key}: unknown field of {model.__name__}")
            continue
        _check(item, model.openapi_types[attribute_of[key]], f"{path}.{key}", found)
    for name in sorted(required_attributes(model)):
        if model.attribute_map[name] not in value:
            found.append(f"{path}: {model.__name__} requires {model.attribute_map[name]}")


# monitoring.coreos.com/v1 ServiceMonitor, written down from prometheus-operator's CRD
# (example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml, operator 0.84):
# the object requires `spec`, the spec requires `endpoints` and `selector`. Only the fields these
# manifests may use are listed, and unknown ones are refused: the API server would silently prune
# a misspelt field from a structural schema, so a typo must fail here instead.
_DURATION = (
    r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
)
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["endpoints", "selector"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "targetLabels": {"type": "array", "items": {"type": "string"}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "matchExpressions": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["key", "operator"],
                                "additionalProperties": False,
                                "properties": {
                                    "key": {"type": "string"},
                                    "operator": {"type": "string"},
                                    "values": {"type": "array", "items": {"type": "string"}},
                                },
                            },
                        },
                    },
                },
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": {"type": "string", "pattern": _DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": _DURATION},
                            "honorLabels": {"type": "boolean"},
                        },
                    },
                },
            },
        },
    },
}


def service_monitor_problems(obj: dict[str, Any]) -> list[str]:
    """What the ServiceMonitor CRD's schema (as written down above) refuses in ``obj``, and what
    ``ObjectMeta`` refuses in its metadata."""
    validator = jsonschema.Draft202012Validator(SERVICE_MONITOR_SCHEMA)
    found = [
        f"{'.'.join(str(p) for p in error.absolute_path) or 'ServiceMonitor'}: {error.message}"
        for error in validator.iter_errors(obj)
    ]
    _check_model(obj.get("metadata", {}), client.V1ObjectMeta, "ServiceMonitor.metadata", found)
    return found
