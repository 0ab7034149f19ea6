"""The subset of kustomize that ops/deploy/ uses, rendered in Python: the tests still check the
manifests where ``kubectl`` is not installed, and compare this renderer with ``kubectl kustomize``
where it is.

Supported, as kustomize (v5) does it:

* ``resources``: YAML files (several documents each) and directories holding a kustomization;
* ``labels`` with ``includeSelectors: false`` and no ``includeTemplates``: added to every
  object's ``metadata.labels`` only;
* ``configMapGenerator`` with ``files`` (the key is the file's name), under
  ``generatorOptions.disableNameSuffixHash: true``;
* ``patches`` from files: a strategic-merge patch (a mapping naming ``apiVersion``, ``kind`` and
  ``metadata.name``/``namespace``; ``null`` deletes a field; the lists below merge by their key,
  every other list is replaced) or a JSON 6902 patch (a list of ``add``/``replace``/``remove``
  operations, with a ``target``);
* ``images``: ``newName``/``newTag``/``digest`` for every ``containers``/``initContainers``
  image of that name.

Anything else raises :class:`UnsupportedKustomization`, so the manifests cannot drift out of the
subset unnoticed.
"""

from __future__ import annotations

import copy
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "MERGE_KEYS",
    "UnsupportedKustomization",
    "identity",
    "kubectl_kustomize",
    "render",
    "strategic_merge",
]

Manifest = dict[str, Any]

# The strategic-merge keys of the lists the overlays patch (from the Kubernetes types'
# `patchMergeKey` tags: PodSpec.containers/initContainers/volumes, Container.env/volumeMounts).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
}

_KUSTOMIZATION_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "labels",
    "configMapGenerator",
    "generatorOptions",
    "patches",
    "images",
}


class UnsupportedKustomization(ValueError):
    """The kustomization uses a feature outside this renderer's subset."""


def identity(obj: Manifest) -> tuple[str, str, str, str]:
    """``(apiVersion, kind, namespace, name)``: what kustomize keys an object by."""
    metadata = obj.get("metadata") or {}
    return (obj["apiVersion"], obj["kind"], metadata.get("namespace", ""), metadata["name"])


def kubectl_kustomize(kubectl: str, root: Path) -> list[Manifest]:
    """The objects ``kubectl kustomize root`` renders."""
    out = subprocess.run(
        [kubectl, "kustomize", str(root)], check=True, capture_output=True, text=True
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


def render(root: Path) -> list[Manifest]:
    """The objects the kustomization in ``root`` renders."""
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(kustomization) - _KUSTOMIZATION_KEYS
    if unknown:
        raise UnsupportedKustomization(f"{root}: {sorted(unknown)} are outside the subset")
    objects: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        path = root / entry
        objects.extend(render(path) if path.is_dir() else _documents(path))
    objects.extend(_generated(root, kustomization))
    for patch in kustomization.get("patches", []):
        _apply_patch(root, patch, objects)
    for pairs in _label_pairs(root, kustomization.get("labels", [])):
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    for image in kustomization.get("images", []):
        for obj in objects:
            _set_images(obj, image)
    seen = [identity(obj) for obj in objects]
    duplicates = {key for key in seen if seen.count(key) > 1}
    if duplicates:
        raise UnsupportedKustomization(f"{root}: objects defined twice: {sorted(duplicates)}")
    return objects


def _documents(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _generated(root: Path, kustomization: dict[str, Any]) -> Iterable[Manifest]:
    generators = kustomization.get("configMapGenerator", [])
    options = kustomization.get("generatorOptions", {})
    if generators and options != {"disableNameSuffixHash": True}:
        raise UnsupportedKustomization(
            f"{root}: generators need generatorOptions {{disableNameSuffixHash: true}} only"
        )
    for generator in generators:
        if set(generator) - {"name", "namespace", "files"}:
            raise UnsupportedKustomization(f"{root}: configMapGenerator takes name/namespace/files")
        metadata = {"name": generator["name"]}
        if "namespace" in generator:
            metadata["namespace"] = generator["namespace"]
        data = {
            Path(name).name: (root / name).read_text(encoding="utf-8")
            for name in generator["files"]
        }
        yield {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}


def _label_pairs(root: Path, entries: list[dict[str, Any]]) -> Iterable[dict[str, str]]:
    for entry in entries:
        if entry.get("includeSelectors") is not False or set(entry) - {
            "pairs",
            "includeSelectors",
        }:
            raise UnsupportedKustomization(
                f"{root}: labels need includeSelectors: false and no other option"
            )
        yield entry["pairs"]


def _apply_patch(root: Path, patch: dict[str, Any], objects: list[Manifest]) -> None:
    if set(patch) - {"path", "target"}:
        raise UnsupportedKustomization(f"{root}: patches take a path (and a target) only")
    content = yaml.safe_load((root / patch["path"]).read_text(encoding="utf-8"))
    if isinstance(content, list):
        target = patch.get("target")
        if target is None:
            raise UnsupportedKustomization(f"{root}: a JSON 6902 patch needs a target")
        for obj in objects:
            if _targets(target, obj):
                for operation in content:
                    _json_patch(obj, operation)
        return
    key = identity(content)
    matches = [obj for obj in objects if identity(obj) == key]
    if len(matches) != 1:
        raise UnsupportedKustomization(f"{root}: patch {patch['path']} matches no object {key}")
    strategic_merge(matches[0], content)


def _targets(target: dict[str, str], obj: Manifest) -> bool:
    group, _, version = obj["apiVersion"].rpartition("/")
    actual = {
        "group": group,
        "version": version,
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
    }
    unknown = set(target) - set(actual)
    if unknown:
        raise UnsupportedKustomization(f"target selectors {sorted(unknown)} are outside the subset")
    return all(actual[field] == wanted for field, wanted in target.items())


def strategic_merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    """Merge ``patch`` into ``base`` in place, as a strategic-merge patch of the lists in
    :data:`MERGE_KEYS` (every other list is replaced; ``None`` deletes)."""
    for key, value in patch.items():
        if isinstance(key, str) and key.startswith("$"):
            raise UnsupportedKustomization(f"patch directive {key} is outside the subset")
        current = base.get(key)
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(current, dict):
            strategic_merge(current, value)
        elif isinstance(value, list) and key in MERGE_KEYS and isinstance(current, list):
            _merge_list(current, value, MERGE_KEYS[key])
        else:
            base[key] = _without_nulls(value)


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> None:
    for item in patch:
        same = [entry for entry in current if entry.get(merge_key) == item[merge_key]]
        if same:
            strategic_merge(same[0], item)
        else:
            current.append(_without_nulls(item))


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return copy.deepcopy(value)


def _json_patch(obj: Manifest, operation: dict[str, Any]) -> None:
    op, path = operation["op"], operation["path"]
    if op not in ("add", "replace", "remove"):
        raise UnsupportedKustomization(f"JSON patch op {op!r} is outside the subset")
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        if op == "add":
            node.insert(len(node) if last == "-" else int(last), operation["value"])
        elif op == "replace":
            node[int(last)] = operation["value"]
        else:
            del node[int(last)]
    elif op == "remove":
        del node[last]
    else:
        if op == "replace" and last not in node:
            raise KeyError(f"JSON patch replaces {path}, which does not exist")
        node[last] = operation["value"]


def _set_images(node: Any, image: dict[str, str]) -> None:
    if isinstance(node, list):
        for item in node:
            _set_images(item, image)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in ("containers", "initContainers") and isinstance(value, list):
            for container in value:
                container["image"] = _new_image(container["image"], image)
        else:
            _set_images(value, image)


def _new_image(current: str, image: dict[str, str]) -> str:
    if set(image) - {"name", "newName", "newTag", "digest"}:
        raise UnsupportedKustomization(f"image options {sorted(image)} are outside the subset")
    name, tag = _split_image(current)
    if name != image["name"]:
        return current
    name = image.get("newName", name)
    if "digest" in image:
        return f"{name}@{image['digest']}"
    if "newTag" in image:
        return f"{name}:{image['newTag']}"
    return name + tag


def _split_image(reference: str) -> tuple[str, str]:
    """``(name, ":tag" or "@digest" or "")``; a registry's ``host:port`` is part of the name."""
    if "@" in reference:
        name, _, digest = reference.partition("@")
        return name, "@" + digest
    slash = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > slash:
        return reference[:colon], reference[colon:]
    return reference, ""
