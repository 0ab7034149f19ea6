"""The Spark and Flink manifests: what their operators accept, and the pods they yield.

Golden files pin each manifest exactly; the schemas (our own subsets of the operators' CRDs and
validators, see each file's ``$comment``) check the fields, types, enums and units; the pods are
derived as the operators derive them (``tests/adapters/kubernetes/operators.py``) and checked
where it matters — on the executor and task-manager pods.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from fleetledger.adapters.testbeds.manifests import (
    APPLICATION_LABEL,
    FLINK_DEPLOYMENT,
    SPARK_APPLICATION,
    ManifestError,
    application_manifest,
    resource_of,
)
from fleetledger.domain.testbeds import (
    SLOT_IDS_ANNOTATION,
    TESTBED_ANNOTATION,
    AppKind,
    ApplicationRequest,
    ApplicationRequested,
    JobDefined,
    JobState,
)
from tests.adapters.kubernetes.operators import (
    flink_task_manager_pods,
    memory_mib,
    milli_cpu,
    spark_executor_pods,
)

HERE = Path(__file__).parent
AT = datetime(2025, 1, 1, tzinfo=UTC)


def job(
    kind: AppKind = "spark",
    *,
    name: str = "wordcount",
    main_file: str = "/opt/jobs/wordcount.py",
    cpu_millis: int = 1000,
    memory_mib: int = 2048,
    slot_ids: tuple[int, ...] = (0, 3),
    nodes: tuple[str, ...] = ("n2", "n1"),
) -> JobState:
    """A job submitted on ``slot_ids`` of testbed ``bed``."""
    defined = JobDefined(name, kind, "registry.local/jobs:1", main_file, ("hdfs:///in",), AT)
    request = ApplicationRequest(
        testbed="bed",
        slot_ids=slot_ids,
        nodes=nodes,
        cpu_millis=cpu_millis,
        memory_mib=memory_mib,
        priority_class="fleetledger-batch",
        scheduler_name="fleetledger",
    )
    requested = ApplicationRequested(name, "s1", request, len(slot_ids), AT)
    return JobState(defined=defined, status="submitted", holder="s1", application=requested)


def manifest(state: JobState) -> dict[str, Any]:
    built = application_manifest(state, namespace="jobs")
    assert built is not None
    # Through JSON, as the API server gets it.
    result: dict[str, Any] = json.loads(json.dumps(built))
    return result


def schema(name: str) -> jsonschema.Draft202012Validator:
    loaded = json.loads((HERE / "schemas" / name).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(loaded)
    return jsonschema.Draft202012Validator(loaded)


SPARK = "sparkapplication-v1beta2.json"
FLINK = "flinkdeployment-v1beta1.json"


def problems(schema_file: str, obj: dict[str, Any]) -> list[str]:
    return [e.message for e in schema(schema_file).iter_errors(obj)]


def without(obj: dict[str, Any], path: str) -> dict[str, Any]:
    """A copy of ``obj`` with the dotted ``path`` removed."""
    copied = copy.deepcopy(obj)
    *parents, last = path.split(".")
    target = copied
    for part in parents:
        target = target[part]
    del target[last]
    return copied


def with_value(obj: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    copied = copy.deepcopy(obj)
    *parents, last = path.split(".")
    target = copied
    for part in parents:
        target = target[part]
    target[last] = value
    return copied


GOLDEN = [
    ("spark-python.json", job("spark")),
    ("spark-scala.json", job("spark", name="etl", main_file="s3a://jars/etl.jar")),
    (
        "flink.json",
        job("flink", name="stream", main_file="/opt/flink/usrlib/job.jar", cpu_millis=2000),
    ),
]


class TestGolden:
    @pytest.mark.parametrize(("golden", "state"), GOLDEN, ids=[g for g, _ in GOLDEN])
    def test_the_manifest_is_the_golden_one(self, golden: str, state: JobState) -> None:
        """Each manifest is exactly its golden file: any change to what is sent shows."""
        expected = json.loads((HERE / "golden" / golden).read_text(encoding="utf-8"))
        assert manifest(state) == expected

    def test_no_manifest_before_a_request(self) -> None:
        """A job without an application request has nothing to create."""
        state = job()
        assert application_manifest(JobState(defined=state.defined), namespace="jobs") is None


class TestSparkSchema:
    def test_the_spark_manifest_passes_the_operators_schema(self) -> None:
        """Required fields, types, enums and units as the v1beta2 CRD wants them."""
        assert problems(SPARK, manifest(job("spark"))) == []

    @pytest.mark.parametrize(
        "path",
        [
            "spec.type",
            "spec.sparkVersion",
            "spec.mainApplicationFile",
            "spec.driver",
            "spec.executor",
        ],
    )
    def test_a_manifest_missing_a_required_field_fails(self, path: str) -> None:
        """The schema can fail: each field the CRD requires is checked."""
        assert problems(SPARK, without(manifest(job("spark")), path)) != []

    @pytest.mark.parametrize(
        ("path", "value"),
        [
            ("spec.executor.memory", "2048Mi"),
            ("spec.executor.memoryOverhead", "384Mi"),
            ("spec.executor.cores", "1"),
            ("spec.executor.cores", 0),
            ("spec.executor.coreRequest", "1 core"),
            ("spec.mode", "local"),
            ("spec.type", "Go"),
            ("spec.executor.instances", 0),
            ("spec.executor.podPriority", 5),
        ],
        ids=str,
    )
    def test_wrong_units_types_and_enums_fail(self, path: str, value: object) -> None:
        """Kubernetes units in JVM fields, a string for cores, an unknown enum value or field
        are all refused."""
        assert problems(SPARK, with_value(manifest(job("spark")), path, value)) != []

    def test_a_pod_template_setting_priority_fails(self) -> None:
        """A pod may not set its priority: admission derives it from the class."""
        bad = manifest(job("spark"))
        bad["spec"]["executor"]["template"]["spec"]["priority"] = 1000
        assert problems(SPARK, bad) != []

    def test_the_type_follows_the_main_file(self) -> None:
        """Python for .py, R for .R, Scala (a JVM jar) otherwise."""
        types = [
            manifest(job("spark", main_file=f))["spec"]["type"] for f in ("/a.py", "/a.R", "/a.jar")
        ]
        assert types == ["Python", "R", "Scala"]


class TestFlinkSchema:
    def test_the_flink_manifest_passes_the_operators_schema(self) -> None:
        """Types, enums and what the operator's validator requires."""
        assert problems(FLINK, manifest(job("flink", main_file="/job.jar"))) == []

    @pytest.mark.parametrize(
        "path",
        [
            "spec.flinkVersion",
            "spec.serviceAccount",
            "spec.taskManager.resource.memory",
            "spec.jobManager.resource",
        ],
    )
    def test_a_manifest_missing_a_required_field_fails(self, path: str) -> None:
        """The schema can fail: each field the operator requires is checked."""
        assert problems(FLINK, without(manifest(job("flink", main_file="/job.jar")), path)) != []

    @pytest.mark.parametrize(
        ("path", "value"),
        [
            ("spec.flinkVersion", "1.20"),
            ("spec.flinkVersion", "v1_14"),
            ("spec.taskManager.resource.cpu", "1"),
            ("spec.taskManager.resource.memory", 2048),
            ("spec.taskManager.resource.memory", "2 gigs"),
            ("spec.taskManager.replicas", 0),
            ("spec.job.upgradeMode", "restart"),
            ("spec.job.jarURI", "/opt/job.jar"),
            ("spec.job.parallelism", 0),
            ("spec.taskManager.podTemplate.spec.priority", 5),
        ],
        ids=str,
    )
    def test_wrong_units_types_and_enums_fail(self, path: str, value: object) -> None:
        """A version spelt as Flink's, a string for CPU, a memory that is not a size, an enum
        value the CRD does not list, a jar without scheme are all refused."""
        base = manifest(job("flink", main_file="/job.jar"))
        assert problems(FLINK, with_value(base, path, value)) != []


def _node_values(pod: dict[str, Any]) -> list[str]:
    required = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    [term] = required["nodeSelectorTerms"]
    [expression] = term["matchExpressions"]
    assert (expression["key"], expression["operator"]) == ("kubernetes.io/hostname", "In")
    return list(expression["values"])


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    [container] = [c for c in pod["spec"]["containers"] if c["name"] == name]
    assert isinstance(container, dict)
    return container


PODS = [
    ("spark", spark_executor_pods, "spark-kubernetes-executor"),
    ("flink", flink_task_manager_pods, "flink-main-container"),
]


@pytest.mark.parametrize(("kind", "derive", "container"), PODS, ids=[k for k, _, _ in PODS])
class TestPods:
    def state(self, kind: str) -> JobState:
        return job("spark" if kind == "spark" else "flink", main_file="/opt/jobs/job.jar")

    def test_one_pod_per_slot(self, kind: str, derive: Any, container: str) -> None:
        """Replication is the slot count."""
        assert len(derive(manifest(self.state(kind)))) == 2

    def test_the_pods_reach_the_extender(self, kind: str, derive: Any, container: str) -> None:
        """Scheduler name, priority class, testbed and slot ids are on every pod."""
        for pod in derive(manifest(self.state(kind))):
            spec, annotations = pod["spec"], pod["metadata"]["annotations"]
            assert (spec["schedulerName"], spec["priorityClassName"]) == (
                "fleetledger",
                "fleetledger-batch",
            )
            assert "priority" not in spec
            assert (annotations[TESTBED_ANNOTATION], annotations[SLOT_IDS_ANNOTATION]) == (
                "bed",
                "0,3",
            )

    def test_the_pods_may_only_go_to_the_slots_nodes(
        self, kind: str, derive: Any, container: str
    ) -> None:
        """A required node affinity to the slots' nodes."""
        for pod in derive(manifest(self.state(kind))):
            assert _node_values(pod) == ["n1", "n2"]

    def test_each_pod_requests_exactly_its_slot(
        self, kind: str, derive: Any, container: str
    ) -> None:
        """CPU and memory requests (memory limit too) are the slot's size."""
        for pod in derive(manifest(self.state(kind))):
            resources = _container(pod, container)["resources"]
            requests, limits = resources["requests"], resources["limits"]
            assert (milli_cpu(requests["cpu"]), memory_mib(requests["memory"])) == (1000, 2048)
            assert (milli_cpu(limits["cpu"]), memory_mib(limits["memory"])) == (1000, 2048)

    def test_the_pods_carry_the_application_label(
        self, kind: str, derive: Any, container: str
    ) -> None:
        """Every pod is labelled with its application's name."""
        app = manifest(self.state(kind))
        for pod in derive(app):
            assert pod["metadata"]["labels"][APPLICATION_LABEL] == app["metadata"]["name"]


class TestSparkMemory:
    @pytest.mark.parametrize("slot", [834, 1000, 2048, 4096, 4225, 16384])
    @pytest.mark.parametrize("main_file", ["/job.jar", "/job.py"])
    def test_the_executor_fills_its_slot_with_at_least_the_default_overhead(
        self, slot: int, main_file: str
    ) -> None:
        """Heap plus overhead is the slot; the overhead is at least what Spark would add by
        default (max(factor × heap, 384 MiB), factor 0.10 for JVM and 0.40 for Python)."""
        app = manifest(job("spark", main_file=main_file, memory_mib=slot))
        executor = app["spec"]["executor"]
        heap = int(executor["memory"].removesuffix("m"))
        overhead = int(executor["memoryOverhead"].removesuffix("m"))
        factor = 0.4 if main_file.endswith(".py") else 0.1
        assert heap + overhead == slot
        assert overhead >= max(int(factor * heap), 384)
        # No larger heap would leave Spark's default overhead room in the slot.
        assert heap + 1 + max(int(factor * (heap + 1)), 384) > slot
        [pod, _] = spark_executor_pods(app)
        resources = _container(pod, "spark-kubernetes-executor")["resources"]
        assert memory_mib(resources["requests"]["memory"]) == slot

    def test_the_default_overhead_alone_would_not_fit(self) -> None:
        """Why the overhead is set: without it, Spark's default for the heap exceeds the slot
        for a Python job (0.40 factor) when the heap is sized for a JVM one."""
        app = manifest(job("spark", main_file="/job.py"))
        executor = app["spec"]["executor"]
        del executor["memoryOverhead"]
        executor["memory"] = "1664m"
        [pod, _] = spark_executor_pods(app)
        requested = _container(pod, "spark-kubernetes-executor")["resources"]["requests"]
        assert memory_mib(requested["memory"]) > 2048

    def test_a_slot_too_small_for_an_executor_is_refused(self) -> None:
        """Under 450 MiB of heap beside 384 MiB of overhead Spark cannot start an executor."""
        with pytest.raises(ManifestError, match="834 MiB"):
            application_manifest(job("spark", memory_mib=833), namespace="jobs")

    @pytest.mark.parametrize(("cpu", "cores"), [(500, 1), (1000, 1), (2500, 2), (4000, 4)])
    def test_cores_are_whole_and_the_request_exact(self, cpu: int, cores: int) -> None:
        """cores is an integer (Spark's task slots), rounded down with at least one; the
        Kubernetes request and limit are the slot's CPU exactly."""
        executor = manifest(job("spark", cpu_millis=cpu))["spec"]["executor"]
        assert (executor["cores"], executor["coreRequest"], executor["coreLimit"]) == (
            cores,
            f"{cpu}m",
            f"{cpu}m",
        )


class TestSparkOperatorPaths:
    def test_the_executor_fields_alone_would_not_reach_the_pods(self) -> None:
        """Why the pod settings are on the template: with a template the operator leaves the
        executors to Spark, so the executor's own schedulerName is not applied."""
        app = manifest(job("spark"))
        executor = app["spec"]["executor"]
        executor["schedulerName"] = executor["template"]["spec"].pop("schedulerName")
        [pod, _] = spark_executor_pods(app)
        assert "schedulerName" not in pod["spec"]


class TestFlink:
    def test_parallelism_is_task_managers_times_task_slots(self) -> None:
        """Each task manager has one task slot per whole core of its testbed slot."""
        spec = manifest(job("flink", main_file="/j.jar", cpu_millis=2000))["spec"]
        assert spec["flinkConfiguration"]["taskmanager.numberOfTaskSlots"] == "2"
        assert (spec["taskManager"]["replicas"], spec["job"]["parallelism"]) == (2, 4)

    def test_a_name_the_flink_operator_refuses_is_refused(self) -> None:
        """The operator accepts at most 45 characters (its cluster id)."""
        with pytest.raises(ManifestError, match="Flink operator"):
            application_manifest(job("flink", name="x" * 42), namespace="jobs")


class TestInputs:
    @pytest.mark.parametrize(
        ("main_file", "uri"),
        [
            ("/opt/job.jar", "local:///opt/job.jar"),
            ("s3a://bucket/job.jar", "s3a://bucket/job.jar"),
            ("local:///opt/job.jar", "local:///opt/job.jar"),
        ],
    )
    def test_a_path_is_a_file_in_the_image(self, main_file: str, uri: str) -> None:
        """An absolute path is local to the image; a URI is kept."""
        spark = manifest(job("spark", main_file=main_file))["spec"]
        flink = manifest(job("flink", main_file=main_file))["spec"]
        assert (spark["mainApplicationFile"], flink["job"]["jarURI"]) == (uri, uri)

    def test_a_relative_main_file_is_refused(self) -> None:
        """Neither operator can find a relative path."""
        with pytest.raises(ManifestError, match="absolute path"):
            application_manifest(job("spark", main_file="job.jar"), namespace="jobs")

    def test_the_resource_of_a_manifest_is_known_by_kind(self) -> None:
        """Spark and Flink manifests map to their resources; anything else is refused."""
        assert resource_of(manifest(job("spark"))) == SPARK_APPLICATION
        assert resource_of(manifest(job("flink", main_file="/j.jar"))) == FLINK_DEPLOYMENT
        with pytest.raises(ManifestError):
            resource_of({"apiVersion": "flinkoperator.k8s.io/v1beta1", "kind": "FlinkCluster"})
