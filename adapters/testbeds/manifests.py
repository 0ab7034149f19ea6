"""The Spark or Flink resource a submitted batch job runs as, in the form its operator accepts.

:func:`application_manifest` builds, from a job that has an application request, either

* a ``SparkApplication`` (``sparkoperator.k8s.io/v1beta2``, the Kubeflow Spark operator), or
* a ``FlinkDeployment`` (``flink.apache.org/v1beta1``, the Apache Flink Kubernetes operator, in
  native application mode),

whose executor or task-manager pods each fit one testbed slot, one pod per slot, and reach the
scheduler extender (seed 05, "Batch Job Operator"): the scheduler name (else the default
scheduler never asks the extender), the priority class (else the kube-scheduler never preempts a
ghost pod), the testbed and slot-id annotations (the extender picks each pod's slot among them)
and a required node affinity to the slots' nodes.

How each operator turns the resource into pods decides where those settings go:

* **Spark.** With ``sparkVersion`` 3.0 or later and an ``executor.template``, the operator hands
  the template to Spark as the executor pod template and does *not* mark executors for its
  mutating webhook, so the executor's own ``schedulerName``, ``priorityClassName`` and
  ``affinity`` fields would be ignored: they are set on the template's pod spec. Annotations go
  through ``executor.annotations`` and the application's own labels are copied onto its pods
  (both passed to Spark as ``spark.kubernetes.executor.annotation.*``/``label.*``, honoured
  either way). Spark sizes the
  executor container itself: memory request and limit are ``memory + memoryOverhead`` MiB, the
  CPU request ``coreRequest`` (else ``cores``), the CPU limit ``coreLimit``.
* **Flink.** The operator merges ``spec.podTemplate`` with ``taskManager.podTemplate`` into the
  task managers' pod template; Flink keeps the template's ``schedulerName``,
  ``priorityClassName`` and ``affinity``, merges its annotations and labels, and sizes the main
  container from ``taskManager.resource``: a request and limit of ``cpu`` cores and ``memory``
  (the task manager's whole process size). ``taskManager.replicas`` fixes the number of task
  managers (parallelism = replicas × task slots per task manager).

Units: Spark's ``memory``/``memoryOverhead`` are JVM sizes (``"1664m"``: MiB), not Kubernetes
quantities; ``cores`` an integer, ``coreRequest``/``coreLimit`` Kubernetes quantities. Flink's
``resource.cpu`` is a number of cores and ``resource.memory`` a Flink memory size (``"2048m"``).

Spark's executor memory overhead defaults to ``max(factor × memory, 384 MiB)`` with a factor of
0.10 for JVM jobs and 0.40 for Python and R; the manifest splits the slot's memory into the
largest heap whose default overhead still fits and sets the overhead explicitly to the rest, so
the executor pod requests exactly the slot. Spark refuses an executor heap under 450 MiB, so a
Spark job needs slots of at least 834 MiB (:class:`ManifestError` otherwise).

A main file given as an absolute path is a file inside the image (``local://`` + path); a URI
is passed as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from fleetledger.domain.testbeds import (
    SLOT_IDS_ANNOTATION,
    TESTBED_ANNOTATION,
    application_name,
    batch_job,
)

from .errors import TestbedsError

__all__ = [
    "APPLICATION_LABEL",
    "APPLICATION_RESOURCES",
    "FLINK_DEPLOYMENT",
    "SPARK_APPLICATION",
    "ApplicationResource",
    "ManifestError",
    "application_manifest",
    "resource_of",
]

APPLICATION_LABEL = "fleetledger.io/application"
"""The label every pod of an application carries: the application's name."""

NODE_LABEL = "kubernetes.io/hostname"

SPARK_EXECUTOR_CONTAINER = "spark-kubernetes-executor"
"""The container the Spark operator names in the executor pod template it hands to Spark."""
SPARK_MIN_OVERHEAD_MIB = 384
SPARK_MIN_EXECUTOR_MIB = 450
"""Spark's floor for an executor's heap (1.5 × its 300 MiB of reserved memory)."""
_JVM_OVERHEAD = Fraction(1, 10)
_NON_JVM_OVERHEAD = Fraction(2, 5)

DRIVER_CORES = 1
DRIVER_MEMORY = "1g"
JOB_MANAGER_CPU = 1.0
JOB_MANAGER_MEMORY = "1024m"

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# The Flink operator refuses other deployment names (its validator's pattern: the name becomes
# the cluster id, a prefix of its services' names).
_FLINK_NAME = re.compile(r"[a-z]([-a-z\d]{0,43}[a-z\d])?")
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


class ManifestError(TestbedsError, ValueError):
    """Raised when a job's application cannot be built as its operator would accept it."""


@dataclass(frozen=True, slots=True)
class ApplicationResource:
    """Where an application kind lives in the API."""

    kind: str
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


SPARK_APPLICATION = ApplicationResource(
    "SparkApplication", "sparkoperator.k8s.io", "v1beta2", "sparkapplications"
)
FLINK_DEPLOYMENT = ApplicationResource(
    "FlinkDeployment", "flink.apache.org", "v1beta1", "flinkdeployments"
)
APPLICATION_RESOURCES = (SPARK_APPLICATION, FLINK_DEPLOYMENT)


def resource_of(manifest: Mapping[str, object]) -> ApplicationResource:
    """The resource a manifest is of, by its ``apiVersion`` and ``kind``."""
    found = (manifest.get("apiVersion"), manifest.get("kind"))
    for resource in APPLICATION_RESOURCES:
        if found == (resource.api_version, resource.kind):
            return resource
    raise ManifestError(
        f"not a SparkApplication ({SPARK_APPLICATION.api_version}) or FlinkDeployment "
        f"({FLINK_DEPLOYMENT.api_version}): apiVersion {found[0]!r}, kind {found[1]!r}"
    )


def application_manifest(
    state: batch_job.JobState,
    *,
    namespace: str,
    spark_version: str = "3.5.3",
    flink_version: str = "v1_20",
    spark_service_account: str = "spark-operator-spark",
    flink_service_account: str = "flink",
) -> dict[str, object] | None:
    """The Spark or Flink resource to create for a submitted job (``None`` before a request).

    ``spark_version`` must be 3.0 or later (executor pod templates); ``flink_version`` is one of
    the operator's ``FlinkVersion`` values (``v1_20``). The service accounts are those the
    operators' charts create for jobs: the Spark driver creates its executors with its own.
    """
    defined, requested = state.defined, state.application
    if defined is None or requested is None:
        return None
    name = application_name(defined.name)
    if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
        raise ManifestError(f"application name {name!r} is not a valid Kubernetes object name")
    if defined.kind == "spark":
        return _spark(
            defined,
            requested,
            name=name,
            namespace=namespace,
            spark_version=spark_version,
            service_account=spark_service_account,
        )
    if not _FLINK_NAME.fullmatch(name):
        raise ManifestError(
            f"the Flink operator refuses the deployment name {name!r}: lower-case letters, "
            "digits and '-', starting with a letter, at most 45 characters"
        )
    return _flink(
        defined,
        requested,
        name=name,
        namespace=namespace,
        flink_version=flink_version,
        service_account=flink_service_account,
    )


def _spark(
    defined: batch_job.JobDefined,
    requested: batch_job.ApplicationRequested,
    *,
    name: str,
    namespace: str,
    spark_version: str,
    service_account: str,
) -> dict[str, object]:
    request = requested.request
    app_type = _spark_type(defined.main_file)
    heap, overhead = _spark_memory(request.memory_mib, non_jvm=app_type in ("Python", "R"))
    labels = {APPLICATION_LABEL: name}
    return {
        "apiVersion": SPARK_APPLICATION.api_version,
        "kind": SPARK_APPLICATION.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "type": app_type,
            "sparkVersion": spark_version,
            "mode": "cluster",
            "image": defined.image,
            "mainApplicationFile": _uri(defined.main_file),
            "arguments": list(defined.arguments),
            # The job's own state machine decides what a failure means; the operator must not
            # run the application again behind its back.
            "restartPolicy": {"type": "Never"},
            "driver": {
                "cores": DRIVER_CORES,
                "memory": DRIVER_MEMORY,
                "serviceAccount": service_account,
            },
            "executor": {
                "instances": requested.replication,
                "cores": _whole_cores(request.cpu_millis),
                "coreRequest": f"{request.cpu_millis}m",
                "coreLimit": f"{request.cpu_millis}m",
                "memory": f"{heap}m",
                "memoryOverhead": f"{overhead}m",
                "annotations": _slot_annotations(request),
                "template": {
                    "spec": {
                        **_placement(request),
                        "containers": [{"name": SPARK_EXECUTOR_CONTAINER}],
                    }
                },
            },
        },
    }


def _flink(
    defined: batch_job.JobDefined,
    requested: batch_job.ApplicationRequested,
    *,
    name: str,
    namespace: str,
    flink_version: str,
    service_account: str,
) -> dict[str, object]:
    request = requested.request
    task_slots = _whole_cores(request.cpu_millis)
    labels = {APPLICATION_LABEL: name}
    return {
        "apiVersion": FLINK_DEPLOYMENT.api_version,
        "kind": FLINK_DEPLOYMENT.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "image": defined.image,
            "flinkVersion": flink_version,
            "serviceAccount": service_account,
            "mode": "native",
            "flinkConfiguration": {"taskmanager.numberOfTaskSlots": str(task_slots)},
            # Shared by the job manager's and the task managers' pods.
            "podTemplate": {"metadata": {"labels": dict(labels)}},
            "jobManager": {
                "replicas": 1,
                "resource": {"cpu": JOB_MANAGER_CPU, "memory": JOB_MANAGER_MEMORY},
            },
            "taskManager": {
                "replicas": requested.replication,
                "resource": {
                    "cpu": request.cpu_millis / 1000,
                    "memory": f"{request.memory_mib}m",
                },
                "podTemplate": {
                    "metadata": {"annotations": _slot_annotations(request)},
                    "spec": _placement(request),
                },
            },
            "job": {
                "jarURI": _uri(defined.main_file),
                "args": list(defined.arguments),
                "parallelism": requested.replication * task_slots,
                # A batch job restarts from nothing; no savepoints to keep.
                "upgradeMode": "stateless",
                "state": "running",
            },
        },
    }


def _slot_annotations(request: batch_job.ApplicationRequest) -> dict[str, str]:
    return {
        TESTBED_ANNOTATION: request.testbed,
        SLOT_IDS_ANNOTATION: ",".join(str(s) for s in request.slot_ids),
    }


def _placement(request: batch_job.ApplicationRequest) -> dict[str, Any]:
    """The pod-spec fields that bring a pod to the extender, on the slots' nodes only."""
    return {
        "schedulerName": request.scheduler_name,
        "priorityClassName": request.priority_class,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {
                                    "key": NODE_LABEL,
                                    "operator": "In",
                                    "values": sorted(set(request.nodes)),
                                }
                            ]
                        }
                    ]
                }
            }
        },
    }


def _spark_type(main_file: str) -> str:
    lowered = main_file.lower()
    if lowered.endswith(".py"):
        return "Python"
    if lowered.endswith(".r"):
        return "R"
    return "Scala"


def _spark_memory(slot_mib: int, *, non_jvm: bool) -> tuple[int, int]:
    """Heap and overhead (MiB) filling a slot: the largest heap whose default overhead fits."""
    factor = _NON_JVM_OVERHEAD if non_jvm else _JVM_OVERHEAD

    def default_overhead(heap: int) -> int:
        return max(int(factor * heap), SPARK_MIN_OVERHEAD_MIB)

    heap = min(slot_mib - SPARK_MIN_OVERHEAD_MIB, int(Fraction(slot_mib) / (1 + factor)))
    while heap > 0 and heap + default_overhead(heap) > slot_mib:
        heap -= 1
    while heap + 1 + default_overhead(heap + 1) <= slot_mib:
        heap += 1
    if heap < SPARK_MIN_EXECUTOR_MIB:
        raise ManifestError(
            f"a slot of {slot_mib} MiB cannot hold a Spark executor: its heap needs at least "
            f"{SPARK_MIN_EXECUTOR_MIB} MiB beside an overhead of at least "
            f"{SPARK_MIN_OVERHEAD_MIB} MiB ({SPARK_MIN_EXECUTOR_MIB + SPARK_MIN_OVERHEAD_MIB} MiB)"
        )
    return heap, slot_mib - heap


def _whole_cores(cpu_millis: int) -> int:
    # Spark's executor cores (its concurrent tasks) and Flink's task slots are whole numbers;
    # rounding down keeps the tasks within the slot's CPU, with at least one.
    return max(1, cpu_millis // 1000)


def _uri(main_file: str) -> str:
    if _URI_SCHEME.match(main_file):
        return main_file
    if main_file.startswith("/"):
        return f"local://{main_file}"
    raise ManifestError(
        f"main file {main_file!r} must be an absolute path inside the image or a URI"
    )
