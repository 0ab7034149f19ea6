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

Every message is both parsed and encoded, so a fake scheduler can speak to the real extender.
Nothing here does I/O: bodies are JSON-ready dicts in and out.

Errors::

    WireError      a body does not have the extender v1 shape, or a pod lacks its slot annotations
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION, PodToPlace

__all__ = [
    "ExtenderPod",
    "FilterArgs",
    "FilterResult",
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


class WireError(ValueError):
    """A body does not have the extender v1 shape, or a pod lacks what placing it needs."""


@dataclass(frozen=True, slots=True)
class ExtenderPod:
    """What the extender reads of a ``core/v1`` Pod."""

    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str] = field(default_factory=dict)


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


@dataclass(frozen=True, slots=True)
class PreemptResult:
    """``ExtenderPreemptionResult``: the nodes the pod may preempt on, with their victims."""

    victims: Mapping[str, MetaVictims]


# -- reading helpers -----------------------------------------------------------------------------


def _object(raw: object, where: str) -> Mapping[str, object]:
    if not isinstance(raw, Mapping):
        raise WireError(f"{where}: expected an object, got {type(raw).__name__}")
    return raw


def _optional_object(body: Mapping[str, object], key: str) -> Mapping[str, object] | None:
    raw = body.get(key)
    return None if raw is None else _object(raw, key)


def _list(raw: object, where: str) -> list[object]:
    if not isinstance(raw, list):
        raise WireError(f"{where}: expected a list, got {type(raw).__name__}")
    return raw


def _text(raw: object, where: str) -> str:
    if not isinstance(raw, str):
        raise WireError(f"{where}: expected text, got {type(raw).__name__}")
    return raw


def _text_map(raw: object, where: str) -> dict[str, str]:
    if raw is None:
        return {}
    return {str(k): _text(v, f"{where}[{k}]") for k, v in _object(raw, where).items()}


def _parse_pod(raw: object, where: str = "Pod") -> ExtenderPod:
    metadata = _object(_object(raw, where).get("metadata"), f"{where}.metadata")
    return ExtenderPod(
        name=_text(metadata.get("name"), f"{where}.metadata.name"),
        namespace=_text(metadata.get("namespace", ""), f"{where}.metadata.namespace"),
        uid=_text(metadata.get("uid", ""), f"{where}.metadata.uid"),
        annotations=_text_map(metadata.get("annotations"), f"{where}.metadata.annotations"),
    )


def _encode_pod(pod: ExtenderPod) -> _Json:
    metadata: _Json = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
    if pod.annotations:
        metadata["annotations"] = dict(pod.annotations)
    return {"metadata": metadata}


def _node_name(node: Mapping[str, object], where: str) -> str:
    metadata = _object(node.get("metadata"), f"{where}.metadata")
    return _text(metadata.get("name"), f"{where}.metadata.name")


def _parse_nodes(raw: object) -> tuple[Mapping[str, object], ...]:
    items = _list(_object(raw, "Nodes").get("items") or [], "Nodes.items")
    return tuple(_object(item, f"Nodes.items[{i}]") for i, item in enumerate(items))


def _parse_node_names(raw: object, where: str) -> tuple[str, ...]:
    return tuple(_text(n, f"{where}[{i}]") for i, n in enumerate(_list(raw, where)))


def _parse_meta_victims(raw: object, where: str) -> MetaVictims:
    body = _object(raw, where)
    pods = _list(body.get("Pods") or [], f"{where}.Pods")
    uids = tuple(_text(_object(p, f"{where}.Pods").get("UID"), f"{where}.UID") for p in pods)
    return MetaVictims(uids, _count(body.get("NumPDBViolations", 0), where))


def _parse_victims(raw: object, where: str) -> MetaVictims:
    body = _object(raw, where)
    pods = _list(body.get("Pods") or [], f"{where}.Pods")
    uids = tuple(_pod_uid(p, f"{where}.Pods[{i}]") for i, p in enumerate(pods))
    return MetaVictims(uids, _count(body.get("NumPDBViolations", 0), where))


def _pod_uid(raw: object, where: str) -> str:
    metadata = _object(_object(raw, where).get("metadata"), f"{where}.metadata")
    return _text(metadata.get("uid"), f"{where}.metadata.uid")


def _count(raw: object, where: str) -> int:
    if type(raw) is not int:
        raise WireError(f"{where}.NumPDBViolations: expected an integer, got {raw!r}")
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
        names = tuple(_node_name(n, f"Nodes.items[{i}]") for i, n in enumerate(nodes))
        return FilterArgs(pod, names, nodes)
    if body.get("NodeNames") is None:
        raise WireError("ExtenderArgs carries neither Nodes nor NodeNames")
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
        body["Nodes"] = {
            "items": [dict(n) for n in args.nodes if _node_name(n, "Nodes") in passing]
        }
    return body


def parse_filter_result(body: Mapping[str, object]) -> FilterResult:
    """Read an ``ExtenderFilterResult`` in either form (for a fake scheduler and tests)."""
    nodes_raw = body.get("Nodes")
    if nodes_raw is not None:
        nodes = _parse_nodes(nodes_raw)
        names = tuple(_node_name(n, f"Nodes.items[{i}]") for i, n in enumerate(nodes))
    else:
        raw_names = body.get("NodeNames")
        names = () if raw_names is None else _parse_node_names(raw_names, "NodeNames")
    return FilterResult(
        names,
        _text_map(body.get("FailedNodes"), "FailedNodes"),
        _text_map(body.get("FailedAndUnresolvableNodes"), "FailedAndUnresolvableNodes"),
        _text(body.get("Error") or "", "Error"),
    )


# -- preempt -------------------------------------------------------------------------------------


def parse_preempt_args(body: Mapping[str, object]) -> PreemptArgs:
    """Read ``ExtenderPreemptionArgs``: meta victims (node-cache-capable) or whole pods."""
    pod = _parse_pod(body.get("Pod"))
    meta = _optional_object(body, "NodeNameToMetaVictims")
    if meta is not None:
        return PreemptArgs(
            pod,
            {n: _parse_meta_victims(v, f"NodeNameToMetaVictims[{n}]") for n, v in meta.items()},
        )
    full = _optional_object(body, "NodeNameToVictims") or {}
    return PreemptArgs(
        pod,
        {n: _parse_victims(v, f"NodeNameToVictims[{n}]") for n, v in full.items()},
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
        {n: _parse_meta_victims(v, f"NodeNameToMetaVictims[{n}]") for n, v in meta.items()}
    )


# -- the pod's slot request ----------------------------------------------------------------------


def pod_to_place(pod: ExtenderPod) -> tuple[str, PodToPlace]:
    """The pod's testbed and what placing it needs, from its annotations (set on the
    application's pod template by :func:`fleetledger.domain.testbeds.application_manifest`)."""
    testbed = pod.annotations.get(TESTBED_ANNOTATION)
    raw_ids = pod.annotations.get(SLOT_IDS_ANNOTATION)
    if not testbed or not raw_ids:
        raise WireError(
            f"pod {pod.namespace}/{pod.name} lacks the {TESTBED_ANNOTATION} and "
            f"{SLOT_IDS_ANNOTATION} annotations; only a batch job's pods use this scheduler"
        )
    try:
        slot_ids = tuple(int(part) for part in raw_ids.split(","))
    except ValueError as e:
        raise WireError(
            f"pod {pod.namespace}/{pod.name}: {SLOT_IDS_ANNOTATION} must be comma-separated "
            f"slot ids, got {raw_ids!r}"
        ) from e
    return testbed, PodToPlace(pod.name, pod.uid, slot_ids)
