"""How the Spark and Flink operators turn their custom objects into executor and task-manager
pods, for tests to check a manifest on the pod it yields rather than on the custom object.

Written from the operators' code (facts, not their code):

**Spark** (kubeflow/spark-operator, ``internal/controller/sparkapplication/submission.go`` and
``internal/webhook/sparkpod_defaulter.go``; Spark's ``BasicExecutorFeatureStep``):

* with ``sparkVersion`` ≥ 3.0.0 and ``executor.template`` set, the operator writes the template
  (plus a non-controller owner reference to the application) as Spark's executor pod template
  and does not label executors for its webhook; otherwise it labels them
  ``sparkoperator.k8s.io/mutated-by-spark-operator`` and its webhook copies the executor's
  ``affinity``, ``schedulerName``, ``priorityClassName`` … onto each pod (if the webhook is
  enabled, as the chart's default is);
* the application's labels and ``executor.labels`` become executor labels, and
  ``executor.annotations`` annotations (``spark.kubernetes.executor.label.*``/``annotation.*``),
  beside Spark's own ``spark-role: executor``, ``spark-exec-id`` and the operator's
  ``sparkoperator.k8s.io/app-name`` and ``launched-by-spark-operator``;
* Spark builds the container named ``spark-kubernetes-executor`` from the template's container of
  that name: memory request and limit ``memory + overhead`` MiB (overhead ``memoryOverhead``, else
  ``max(factor × memory, 384)``, factor 0.10 for JVM and 0.40 for Python/R applications), CPU
  request ``coreRequest`` else ``cores``, CPU limit ``coreLimit`` when set; ``restartPolicy:
  Never``; the image is ``executor.image`` else ``spec.image``.

**Flink** (apache/flink-kubernetes-operator ``FlinkConfigBuilder`` and ``FlinkUtils``; Flink's
``InitTaskManagerDecorator`` and ``KubernetesUtils.getResourceRequirements``):

* the task managers' pod template is ``spec.podTemplate`` merged with
  ``taskManager.podTemplate`` (objects key by key, arrays element by element by index — the
  default of ``kubernetes.operator.pod-template.merge-arrays-by-name`` — the task managers'
  values winning);
* Flink keeps the template's pod spec (scheduler name, priority class, affinity), merges its
  labels (adding ``type: flink-native-kubernetes``, ``app: <name>``, ``component: taskmanager``)
  and annotations, sets ``serviceAccountName`` to ``spec.serviceAccount`` and ``restartPolicy:
  Never``, and sizes the container ``flink-main-container``: CPU request ``resource.cpu`` and
  limit ``cpu × 1.0``, memory request and limit ``resource.memory`` (the process size) in MiB;
* there are ``taskManager.replicas`` task managers, named ``<name>-taskmanager-1-<n>``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

from kubernetes.utils import parse_quantity

__all__ = [
    "flink_task_manager_pods",
    "memory_mib",
    "milli_cpu",
    "spark_executor_pods",
]

_parse: Callable[[object], Decimal] = parse_quantity
SPARK_CONTAINER = "spark-kubernetes-executor"
FLINK_CONTAINER = "flink-main-container"
_JVM_UNITS: dict[str, Fraction | int] = {
    "": 1,
    "b": Fraction(1, 1 << 20),
    "k": Fraction(1, 1024),
    "m": 1,
    "g": 1024,
    "t": 1024**2,
    "p": 1024**3,
}
_FLINK_UNITS: dict[str, Fraction | int] = {
    "": Fraction(1, 1 << 20),
    "b": Fraction(1, 1 << 20),
    "bytes": Fraction(1, 1 << 20),
    "k": Fraction(1, 1024),
    "kb": Fraction(1, 1024),
    "kibibytes": Fraction(1, 1024),
    "m": 1,
    "mb": 1,
    "mebibytes": 1,
    "g": 1024,
    "gb": 1024,
    "gibibytes": 1024,
    "t": 1024**2,
    "tb": 1024**2,
    "tebibytes": 1024**2,
}


def spark_executor_pods(app: dict[str, Any]) -> list[dict[str, Any]]:
    """The executor pods the Spark operator and Spark make of a ``SparkApplication``."""
    spec = app["spec"]
    executor = spec["executor"]
    name = app["metadata"]["name"]
    template = executor.get("template")
    with_template = template is not None and _version(spec["sparkVersion"]) >= (3, 0)
    if with_template:
        base = copy.deepcopy(template)
        base.setdefault("metadata", {}).setdefault("ownerReferences", []).append(
            # An owner reference names its owner's uid too (required by the API's schema).
            {
                "apiVersion": app["apiVersion"],
                "kind": app["kind"],
                "name": name,
                "uid": app["metadata"].get("uid", ""),
            }
        )
    else:
        base = {"metadata": {}, "spec": {}}
    labels = {
        **(app["metadata"].get("labels") or {}),
        **(executor.get("labels") or {}),
        "sparkoperator.k8s.io/app-name": name,
        "sparkoperator.k8s.io/launched-by-spark-operator": "true",
        "spark-role": "executor",
    }
    if not with_template:
        labels["sparkoperator.k8s.io/mutated-by-spark-operator"] = "true"
    memory = _jvm_mib(executor.get("memory", "1g"))
    if "memoryOverhead" in executor:
        overhead = _jvm_mib(executor["memoryOverhead"])
    else:
        factor = (
            Fraction(spec["memoryOverheadFactor"])
            if "memoryOverheadFactor" in spec
            else (Fraction(2, 5) if spec["type"] in ("Python", "R") else Fraction(1, 10))
        )
        overhead = max(int(factor * memory), 384)
    total = f"{memory + overhead}Mi"
    cpu_request = executor.get("coreRequest", str(executor.get("cores", 1)))
    pods = []
    for executor_id in range(1, int(executor.get("instances", 1)) + 1):
        pod = copy.deepcopy(base)
        metadata = pod.setdefault("metadata", {})
        metadata["name"] = f"{name}-exec-{executor_id}"
        metadata["labels"] = {
            **(metadata.get("labels") or {}),
            **labels,
            "spark-exec-id": str(executor_id),
        }
        metadata["annotations"] = {
            **(metadata.get("annotations") or {}),
            **(executor.get("annotations") or {}),
        }
        pod_spec = pod.setdefault("spec", {})
        if not with_template:
            # The operator's webhook.
            for field in ("affinity", "schedulerName", "priorityClassName", "nodeSelector"):
                if field in executor:
                    pod_spec[field] = copy.deepcopy(executor[field])
        pod_spec["restartPolicy"] = "Never"
        containers = pod_spec.setdefault("containers", [])
        container = next((c for c in containers if c.get("name") == SPARK_CONTAINER), None)
        if container is None:
            container = {"name": SPARK_CONTAINER}
            containers.insert(0, container)
        container["image"] = executor.get("image", spec.get("image"))
        resources = container.setdefault("resources", {})
        resources.setdefault("requests", {}).update({"memory": total, "cpu": cpu_request})
        resources.setdefault("limits", {})["memory"] = total
        if "coreLimit" in executor:
            resources["limits"]["cpu"] = executor["coreLimit"]
        pods.append(pod)
    return pods


def flink_task_manager_pods(deployment: dict[str, Any]) -> list[dict[str, Any]]:
    """The task-manager pods the Flink operator and Flink make of a ``FlinkDeployment``."""
    spec = deployment["spec"]
    name = deployment["metadata"]["name"]
    task_manager = spec["taskManager"]
    template = _merge(copy.deepcopy(spec.get("podTemplate") or {}), task_manager.get("podTemplate"))
    resource = task_manager["resource"]
    cpu = float(resource["cpu"])
    memory = f"{_flink_mib(resource['memory'])}Mi"
    pods = []
    for index in range(1, int(task_manager["replicas"]) + 1):
        pod = copy.deepcopy(template)
        metadata = pod.setdefault("metadata", {})
        metadata["name"] = f"{name}-taskmanager-1-{index}"
        metadata["labels"] = {
            **(metadata.get("labels") or {}),
            "type": "flink-native-kubernetes",
            "app": name,
            "component": "taskmanager",
        }
        metadata.setdefault("annotations", {})
        pod_spec = pod.setdefault("spec", {})
        pod_spec["serviceAccount"] = pod_spec["serviceAccountName"] = spec["serviceAccount"]
        pod_spec["restartPolicy"] = "Never"
        containers = pod_spec.setdefault("containers", [])
        container = next((c for c in containers if c.get("name") == FLINK_CONTAINER), None)
        if container is None:
            container = {"name": FLINK_CONTAINER}
            containers.insert(0, container)
        container["image"] = spec.get("image")
        container["resources"] = {
            "requests": {"cpu": str(cpu), "memory": memory},
            "limits": {"cpu": str(cpu * 1.0), "memory": memory},
        }
        pods.append(pod)
    return pods


def milli_cpu(quantity: str) -> int:
    """A CPU quantity in milli-CPU."""
    return int(_parse(quantity) * 1000)


def memory_mib(quantity: str) -> int:
    """A memory quantity in MiB."""
    return int(_parse(quantity) / (1 << 20))


def _merge(to: dict[str, Any], source: dict[str, Any] | None) -> dict[str, Any]:
    for key, value in (source or {}).items():
        current = to.get(key)
        if isinstance(current, list) and isinstance(value, list):
            for i, item in enumerate(value):
                if i >= len(current):
                    current.append(copy.deepcopy(item))
                elif isinstance(current[i], dict) and isinstance(item, dict):
                    _merge(current[i], item)
                else:
                    current[i] = copy.deepcopy(item)
        elif isinstance(current, dict) and isinstance(value, dict):
            _merge(current, value)
        else:
            to[key] = copy.deepcopy(value)
    return to


def _jvm_mib(size: str) -> int:
    match = re.fullmatch(r"(\d+)([a-zA-Z]*)", size.strip())
    assert match is not None, f"not a JVM size: {size!r}"
    unit = match.group(2).lower()
    unit = unit[:-1] if len(unit) == 2 and unit.endswith("b") else unit
    assert unit in _JVM_UNITS, f"Spark refuses the JVM size {size!r}"
    return int(int(match.group(1)) * _JVM_UNITS[unit])


def _flink_mib(size: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([a-zA-Z]*)", size.strip())
    if match is not None and match.group(2).lower() in _FLINK_UNITS:
        return int(int(match.group(1)) * _FLINK_UNITS[match.group(2).lower()])
    return int(_parse(size) / (1 << 20))


def _version(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:2])
