"""The Kubernetes scheduler extender v1 wire format, as frozen dataclasses.

The kube-scheduler posts JSON whose keys are the Go field names of
``k8s.io/kube-scheduler/extender/v1`` (PascalCase, no json tags): ``ExtenderArgs``
(``Pod``, ``Nodes``, ``NodeNames``), ``ExtenderFilterResult`` (``Nodes``, ``NodeNames``,
``FailedNodes``, ``FailedAndUnresolvableNodes``, ``Error``), ``ExtenderPreemptionArgs`` (``Pod``,
``NodeNameToVictims``, ``NodeNameToMetaVictims``) and ``ExtenderPreemptionResult``
(``NodeNameToMetaVictims``, each ``{"Pods": [{"UID": …}], "NumPDBViolations": n}``). The pods and
nodes inside are ordinary ``core/v1`` objects with camelCase keys.

``nodeCacheCapable`` changes the shapes both ways: a node-cache-capable extender receives
``NodeNames`` and ``NodeNameToMetaVictims`` and must answer ``NodeNames``; otherwise it receives
whole ``Nodes`` (a ``NodeList``) and ``NodeNameToVictims`` (whole pods) and must answer ``Nodes``.
Parsing records which form came in, so the answer is encoded in the form the scheduler expects.
The nodes of the preemption args' map are the scheduler's candidates: it accepts an answer only
on them, each with at least one victim it found there.

A pod says where it may go in one of two ways (:func:`pod_to_place`):

* this project's annotations, set on the application's pod template:
  ``fleetledger.io/testbed`` (the testbed's name) and ``fleetledger.io/slot-ids``
  (comma-separated slot ids);
* the original operator's labels (seed 05), for pods written for that interface:
  ``batchjob.tuberlin.de/slots-resource-name`` (the testbed's name) and
  ``batchjob.tuberlin.de/slots-ids`` — slot ids joined by ``_``, since a label value cannot hold
  a comma.

Every message is both parsed and encoded, so a fake scheduler can speak to the real extender.
Nothing here does I/O: bodies are JSON-ready dicts in and out.

What reaches the log (the pod's name, namespace and UID, the candidate nodes' names, the testbed's
name) is held to the edge rule (:mod:`fleetledger.adapters.http.edge`): Kubernetes names of their
kind and length, no control character, no lone surrogate. Whatever else the scheduler sends (the
rest of a node object) is passed back as it came.

Errors::

    WireError      a body does not have the extender v1 shape, or a pod lacks its slot request;
                   ``loc`` is the path to the field at fault (as in the API's ``detail[].loc``)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeAlias

from fleetledger.adapters.http import edge
from fleetledger.domain.testbeds import (
    SEED_SLOT_IDS_LABEL,
    SEED_TESTBED_LABEL,
    SLOT_IDS_ANNOTATION,
    TESTBED_ANNOTATION,
    PodToPlace,
)

__all__ = [
    "ExtenderPod",
    "FilterArgs",
    "FilterResult",
    "Loc",
    "MetaVictims",
    "PreemptArgs",
    "PreemptResult",
    "WireError",
    "encode_filter_args",
    "encode_filter_result",
    "encode_preempt_args",
    "encode_preempt_result",
    "parse_filter_args",
    "parse_filter_result",
    "parse_preempt_args",
    "parse_preempt_result",
    "pod_to_place",
]


_Json = dict[str, object]
Loc: TypeAlias = tuple[str | int, ...]


class WireError(ValueError):
    """A body does not have the extender v1 shape, or a pod lacks what placing it needs.

    ``loc`` is the path of the field at fault from the body's root (``("Pod", "metadata",
    "name")``), ``reason`` what is wrong with it; the message joins both.
    """

    def __init__(self, loc: Loc, reason: str) -> None:
        super().__init__(f"{_render(loc)}: {reason}" if loc else reason)
        self.loc = loc
        self.reason = reason


def _render(loc: Loc) -> str:
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif text and "." not in part and "/" not in part:
            text += f".{part}"
        elif text:
            text += f"[{part}]"
        else:
            text = part
    return text


@dataclass(frozen=True, slots=True)
class ExtenderPod:
    """What the extender reads of a ``core/v1`` Pod."""

    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FilterArgs:
    """``ExtenderArgs``. ``nodes`` holds the whole node objects when the scheduler sent them
    (not node-cache-capable), so the answer can return them unchanged."""

    pod: ExtenderPod
    node_names: tuple[str, ...]
    nodes: tuple[Mapping[str, object], ...] | None = None

    @property
    def node_cache_capable(self) -> bool:
        return self.nodes is None


@dataclass(frozen=True, slots=True)
class FilterResult:
    """``ExtenderFilterResult``: the nodes that pass, and why the others do not."""

    node_names: tuple[str, ...]
    failed_nodes: Mapping[str, str] = field(default_factory=dict)
    failed_and_unresolvable_nodes: Mapping[str, str] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True, slots=True)
class MetaVictims:
    """The pods to evict on one node, by UID."""

    pod_uids: tuple[str, ...]
    num_pdb_violations: int = 0


@dataclass(frozen=True, slots=True)
class PreemptArgs:
    """``ExtenderPreemptionArgs``: the preemptor and the scheduler's candidate victims."""

    pod: ExtenderPod
    victims: Mapping[str, MetaVictims]
    node_cache_capable: bool = True

    @property
    def candidate_nodes(self) -> tuple[str, ...]:
        """The nodes the scheduler would preempt on: the only ones it accepts in the answer."""
        return tuple(self.victims)


@dataclass(frozen=True, slots=True)
class PreemptResult:
    """``ExtenderPreemptionResult``: the nodes the pod may preempt on, with their victims."""

    victims: Mapping[str, MetaVictims]


# -- reading helpers -----------------------------------------------------------------------------


def _kind(raw: object) -> str:
    return "null" if raw is None else type(raw).__name__


def _object(raw: object, loc: Loc) -> Mapping[str, object]:
    # Parsed JSON gives dicts: checked first, since an ABC check costs ten times as much.
    if type(raw) is not dict and not isinstance(raw, Mapping):
        raise WireError(loc, f"expected an object, got {_kind(raw)}")
    return raw


def _optional_object(body: Mapping[str, object], key: str) -> Mapping[str, object] | None:
    raw = body.get(key)
    return None if raw is None else _object(raw, (key,))


def _list(raw: object, loc: Loc) -> list[object]:
    if not isinstance(raw, list):
        raise WireError(loc, f"expected a list, got {_kind(raw)}")
    return raw


def _text(raw: object, loc: Loc) -> str:
    if not isinstance(raw, str):
        raise WireError(loc, f"expected text, got {_kind(raw)}")
    return raw


_POD_NAME = re.compile(edge.DNS_SUBDOMAIN_PATTERN)
_NODE_NAME = _POD_NAME
_NAMESPACE = re.compile(edge.DNS_LABEL_PATTERN)
_UID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.:]*$")
_MAX_SLOT_IDS = 10_000
_MAX_SLOT_ID_DIGITS = 7
"""As the testbeds API: slot ids up to 1,000,000, at most 10,000 of them per pod."""


def _name(raw: object, loc: Loc, *, max_length: int, pattern: re.Pattern[str]) -> str:
    """Text that reaches the log: held to the edge rule (a ``WireError`` naming the field)."""
    text = _text(raw, loc)
    if not text and pattern is not _POD_NAME:
        return text  # namespace and uid may be missing; a pod's name may not
    try:
        return edge.check_text(text, loc, max_length=max_length, pattern=pattern)
    except edge.EdgeError as e:
        raise WireError(loc, e.reason) from None


def _node_name_checked(raw: object, loc: Loc) -> str:
    return _name(raw, loc, max_length=edge.MAX_DNS_SUBDOMAIN, pattern=_NODE_NAME)


def _text_map(raw: object, loc: Loc) -> dict[str, str]:
    if raw is None:
        return {}
    # Parsed JSON: a dict of texts is taken as is; anything else is checked key by key.
    if type(raw) is dict and all(type(v) is str for v in raw.values()):
        return raw
    return {str(k): _text(v, (*loc, str(k))) for k, v in _object(raw, loc).items()}


def _parse_pod(raw: object, loc: Loc = ("Pod",)) -> ExtenderPod:
    metadata = _object(_object(raw, loc).get("metadata"), (*loc, "metadata"))
    where = (*loc, "metadata")
    return ExtenderPod(
        name=_name(
            metadata.get("name"),
            (*where, "name"),
            max_length=edge.MAX_DNS_SUBDOMAIN,
            pattern=_POD_NAME,
        ),
        namespace=_name(
            metadata.get("namespace", ""),
            (*where, "namespace"),
            max_length=edge.MAX_DNS_LABEL,
            pattern=_NAMESPACE,
        ),
        uid=_name(
            metadata.get("uid", ""), (*where, "uid"), max_length=edge.MAX_UID_LENGTH, pattern=_UID
        ),
        annotations=_text_map(metadata.get("annotations"), (*where, "annotations")),
        labels=_text_map(metadata.get("labels"), (*where, "labels")),
    )


def _encode_pod(pod: ExtenderPod) -> _Json:
    metadata: _Json = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    if pod.labels:
        metadata["labels"] = dict(pod.labels)
    if pod.annotations:
        metadata["annotations"] = dict(pod.annotations)
    return {"metadata": metadata}


def _node_name(node: Mapping[str, object], loc: Loc) -> str:
    metadata = node.get("metadata")
    # Parsed JSON, as it comes: no location is built unless the node is at fault.
    if (
        type(metadata) is dict
        and type(name := metadata.get("name")) is str
        and len(name) <= edge.MAX_DNS_SUBDOMAIN
        and _NODE_NAME.match(name)
    ):
        return name
    metadata = _object(node.get("metadata"), (*loc, "metadata"))
    return _node_name_checked(metadata.get("name"), (*loc, "metadata", "name"))


def _parse_nodes(raw: object) -> tuple[Mapping[str, object], ...]:
    items = _list(_object(raw, ("Nodes",)).get("items") or [], ("Nodes", "items"))
    return tuple(_object(item, ("Nodes", "items", i)) for i, item in enumerate(items))


def _parse_node_names(raw: object, key: str) -> tuple[str, ...]:
    return tuple(_node_name_checked(n, (key, i)) for i, n in enumerate(_list(raw, (key,))))


def _parse_meta_victims(raw: object, loc: Loc) -> MetaVictims:
    body = _object(raw, loc)
    pods = _list(body.get("Pods") or [], (*loc, "Pods"))
    uids = tuple(
        _text(_object(p, (*loc, "Pods", i)).get("UID"), (*loc, "Pods", i, "UID"))
        for i, p in enumerate(pods)
    )
    return MetaVictims(uids, _count(body.get("NumPDBViolations", 0), loc))


def _parse_victims(raw: object, loc: Loc) -> MetaVictims:
    body = _object(raw, loc)
    pods = _list(body.get("Pods") or [], (*loc, "Pods"))
    uids = tuple(_pod_uid(p, (*loc, "Pods", i)) for i, p in enumerate(pods))
    return MetaVictims(uids, _count(body.get("NumPDBViolations", 0), loc))


def _pod_uid(raw: object, loc: Loc) -> str:
    metadata = _object(_object(raw, loc).get("metadata"), (*loc, "metadata"))
    return _text(metadata.get("uid"), (*loc, "metadata", "uid"))


def _count(raw: object, loc: Loc) -> int:
    if type(raw) is not int:
        raise WireError((*loc, "NumPDBViolations"), f"expected an integer, got {_kind(raw)}")
    return raw


def _encode_meta_victims(victims: MetaVictims) -> _Json:
    return {
        "Pods": [{"UID": uid} for uid in victims.pod_uids],
        "NumPDBViolations": victims.num_pdb_violations,
    }


# -- filter --------------------------------------------------------------------------------------


def parse_filter_args(body: Mapping[str, object]) -> FilterArgs:
    """Read the scheduler's ``ExtenderArgs`` in either ``nodeCacheCapable`` form."""
    pod = _parse_pod(body.get("Pod"))
    nodes_raw = body.get("Nodes")
    if nodes_raw is not None:
        nodes = _parse_nodes(nodes_raw)
        names = tuple(_node_name(n, ("Nodes", "items", i)) for i, n in enumerate(nodes))
        return FilterArgs(pod, names, nodes)
    if body.get("NodeNames") is None:
        raise WireError(("NodeNames",), "ExtenderArgs carries neither Nodes nor NodeNames")
    return FilterArgs(pod, _parse_node_names(body["NodeNames"], "NodeNames"))


def encode_filter_args(args: FilterArgs) -> _Json:
    """``ExtenderArgs`` as the scheduler sends it (for a fake scheduler and tests)."""
    if args.nodes is None:
        return {"Pod": _encode_pod(args.pod), "Nodes": None, "NodeNames": list(args.node_names)}
    nodes = [dict(n) for n in args.nodes]
    return {"Pod": _encode_pod(args.pod), "Nodes": {"items": nodes}, "NodeNames": None}


def encode_filter_result(result: FilterResult, *, args: FilterArgs) -> _Json:
    """``ExtenderFilterResult`` in the form ``args`` came in: node names for a node-cache-capable
    extender, else the passing node objects exactly as received."""
    body: _Json = {
        "Nodes": None,
        "NodeNames": None,
        "FailedNodes": dict(result.failed_nodes),
        "FailedAndUnresolvableNodes": dict(result.failed_and_unresolvable_nodes),
        "Error": result.error,
    }
    if args.nodes is None:
        body["NodeNames"] = list(result.node_names)
    else:
        passing = set(result.node_names)
        # The names were read from these very objects when the args were parsed.
        body["Nodes"] = {
            "items": [
                n for n, name in zip(args.nodes, args.node_names, strict=True) if name in passing
            ]
        }
    return body


def parse_filter_result(body: Mapping[str, object]) -> FilterResult:
    """Read an ``ExtenderFilterResult`` in either form (for a fake scheduler and tests)."""
    nodes_raw = body.get("Nodes")
    if nodes_raw is not None:
        nodes = _parse_nodes(nodes_raw)
        names = tuple(_node_name(n, ("Nodes", "items", i)) for i, n in enumerate(nodes))
    else:
        raw_names = body.get("NodeNames")
        names = () if raw_names is None else _parse_node_names(raw_names, "NodeNames")
    return FilterResult(
        names,
        _text_map(body.get("FailedNodes"), ("FailedNodes",)),
        _text_map(body.get("FailedAndUnresolvableNodes"), ("FailedAndUnresolvableNodes",)),
        _text(body.get("Error") or "", ("Error",)),
    )


# -- preempt -------------------------------------------------------------------------------------


def parse_preempt_args(body: Mapping[str, object]) -> PreemptArgs:
    """Read ``ExtenderPreemptionArgs``: meta victims (node-cache-capable) or whole pods. The
    scheduler always sends one of the two maps (empty when it found no candidate)."""
    pod = _parse_pod(body.get("Pod"))
    meta = _optional_object(body, "NodeNameToMetaVictims")
    if meta is not None:
        return PreemptArgs(
            pod,
            {
                _node_name_checked(n, ("NodeNameToMetaVictims", n)): _parse_meta_victims(
                    v, ("NodeNameToMetaVictims", n)
                )
                for n, v in meta.items()
            },
        )
    full = _optional_object(body, "NodeNameToVictims")
    if full is None:
        raise WireError(
            ("NodeNameToMetaVictims",),
            "ExtenderPreemptionArgs carries neither NodeNameToMetaVictims nor NodeNameToVictims",
        )
    return PreemptArgs(
        pod,
        {
            _node_name_checked(n, ("NodeNameToVictims", n)): _parse_victims(
                v, ("NodeNameToVictims", n)
            )
            for n, v in full.items()
        },
        node_cache_capable=False,
    )


def encode_preempt_args(args: PreemptArgs) -> _Json:
    """``ExtenderPreemptionArgs`` as the scheduler sends it (victim pods reduced to their UID
    when not node-cache-capable)."""
    body: _Json = {"Pod": _encode_pod(args.pod)}
    if args.node_cache_capable:
        body["NodeNameToVictims"] = None
        body["NodeNameToMetaVictims"] = {
            n: _encode_meta_victims(v) for n, v in args.victims.items()
        }
    else:
        body["NodeNameToVictims"] = {
            n: {
                "Pods": [{"metadata": {"uid": uid}} for uid in v.pod_uids],
                "NumPDBViolations": v.num_pdb_violations,
            }
            for n, v in args.victims.items()
        }
        body["NodeNameToMetaVictims"] = None
    return body


def encode_preempt_result(result: PreemptResult) -> _Json:
    """``ExtenderPreemptionResult``: always meta victims, whatever form the args came in."""
    return {
        "NodeNameToMetaVictims": {n: _encode_meta_victims(v) for n, v in result.victims.items()}
    }


def parse_preempt_result(body: Mapping[str, object]) -> PreemptResult:
    """Read an ``ExtenderPreemptionResult`` (for a fake scheduler and tests)."""
    meta = _optional_object(body, "NodeNameToMetaVictims") or {}
    return PreemptResult(
        {n: _parse_meta_victims(v, ("NodeNameToMetaVictims", n)) for n, v in meta.items()}
    )


# -- the pod's slot request ----------------------------------------------------------------------


def pod_to_place(pod: ExtenderPod) -> tuple[str, PodToPlace]:
    """The pod's testbed and what placing it needs: from this project's annotations (set on the
    application's pod template by :func:`fleetledger.domain.testbeds.application_manifest`), else
    from the original operator's labels (see the module docstring)."""
    if TESTBED_ANNOTATION in pod.annotations or SLOT_IDS_ANNOTATION in pod.annotations:
        bed, ids = _slot_request(
            pod, pod.annotations, "annotations", TESTBED_ANNOTATION, SLOT_IDS_ANNOTATION
        )
        return bed, PodToPlace(pod.name, pod.uid, _slot_ids(pod, ids, SLOT_IDS_ANNOTATION, ","))
    if SEED_TESTBED_LABEL in pod.labels or SEED_SLOT_IDS_LABEL in pod.labels:
        bed, ids = _slot_request(pod, pod.labels, "labels", SEED_TESTBED_LABEL, SEED_SLOT_IDS_LABEL)
        return bed, PodToPlace(pod.name, pod.uid, _slot_ids(pod, ids, SEED_SLOT_IDS_LABEL, "_"))
    raise WireError(
        ("Pod", "metadata", "annotations"),
        f"pod {pod.namespace}/{pod.name} lacks the {TESTBED_ANNOTATION} and "
        f"{SLOT_IDS_ANNOTATION} annotations (or the {SEED_TESTBED_LABEL} and "
        f"{SEED_SLOT_IDS_LABEL} labels); only a batch job's pods use this scheduler",
    )


def _slot_request(
    pod: ExtenderPod, values: Mapping[str, str], where: str, bed_key: str, ids_key: str
) -> tuple[str, str]:
    bed, ids = values.get(bed_key, ""), values.get(ids_key, "")
    for key, value in ((bed_key, bed), (ids_key, ids)):
        if not value.strip():
            raise WireError(
                ("Pod", "metadata", where, key),
                f"pod {pod.namespace}/{pod.name} has {bed_key if key == ids_key else ids_key} "
                f"but no {key}; both are needed to place it",
            )
    if len(bed) > edge.MAX_DNS_LABEL or _NAMESPACE.match(bed) is None:
        raise WireError(
            ("Pod", "metadata", where, bed_key),
            f"pod {pod.namespace}/{pod.name}: the testbed's name must be a Kubernetes name "
            f"(lower-case letters, digits and '-', at most {edge.MAX_DNS_LABEL})",
        )
    return bed, ids


def _slot_ids(pod: ExtenderPod, raw: str, key: str, separator: str) -> tuple[int, ...]:
    where: Loc = ("Pod", "metadata", "labels" if separator == "_" else "annotations", key)
    parts = [part.strip() for part in raw.split(separator)]
    # Bounded before int(): a slot id of thousands of digits would make int() raise.
    if len(parts) > _MAX_SLOT_IDS or not all(
        part.isascii() and part.isdigit() and len(part) <= _MAX_SLOT_ID_DIGITS for part in parts
    ):
        raise WireError(
            where,
            f"pod {pod.namespace}/{pod.name}: slot ids must be at most {_MAX_SLOT_IDS} "
            f"non-negative integers of at most {_MAX_SLOT_ID_DIGITS} digits joined by "
            f"{separator!r}",
        )
    return tuple(int(part) for part in parts)
