"""KubernetesApplications with the real client against a fake API server on loopback: the
operators' custom objects created, read and deleted as the API server answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from fleetledger.adapters.kubernetes import KubernetesApplications
from fleetledger.adapters.kubernetes.applications import flink_phase, spark_phase
from fleetledger.adapters.testbeds.applications import (
    ApplicationsUnavailable,
    InvalidApplication,
    OperatorMissing,
)
from fleetledger.adapters.testbeds.manifests import (
    FLINK_DEPLOYMENT,
    SPARK_APPLICATION,
    ApplicationResource,
    application_manifest,
)
from fleetledger.domain.testbeds import (
    AppKind,
    ApplicationRequest,
    ApplicationRequested,
    JobDefined,
    JobState,
)

from .fake_api import FakeApiServer, Served, fake_api_server

SCHEMAS = Path(__file__).parent.parent / "testbeds" / "schemas"
SPARK_KEY = f"{SPARK_APPLICATION.plural}.{SPARK_APPLICATION.group}"
FLINK_KEY = f"{FLINK_DEPLOYMENT.plural}.{FLINK_DEPLOYMENT.group}"
AT = datetime(2025, 1, 1, tzinfo=UTC)


def served(resource: ApplicationResource, schema_file: str) -> Served:
    schema = json.loads((SCHEMAS / schema_file).read_text(encoding="utf-8"))
    return Served(resource.group, resource.version, resource.plural, resource.kind, schema)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with fake_api_server() as server:
        server.serve(served(SPARK_APPLICATION, "sparkapplication-v1beta2.json"))
        server.serve(served(FLINK_DEPLOYMENT, "flinkdeployment-v1beta1.json"))
        yield server


def connect(api: FakeApiServer) -> client.ApiClient:
    return client.ApiClient(client.Configuration(host=api.url))


@pytest.fixture
def apps(api: FakeApiServer) -> KubernetesApplications:
    return KubernetesApplications(connect(api), namespace="jobs")


def manifest(kind: AppKind = "spark", name: str = "j1") -> dict[str, Any]:
    main_file = "/opt/job.py" if kind == "spark" else "/opt/job.jar"
    defined = JobDefined(name, kind, "registry.local/jobs:1", main_file, (), AT)
    request = ApplicationRequest("bed", (0, 1), ("n1",), 1000, 2048, "fleetledger-batch", "fl")
    state = JobState(
        defined=defined,
        status="submitted",
        holder="s1",
        application=ApplicationRequested(name, "s1", request, 2, AT),
    )
    built = application_manifest(state, namespace="jobs")
    assert built is not None
    return dict(built)


class TestCreate:
    @pytest.mark.parametrize(("kind", "key"), [("spark", SPARK_KEY), ("flink", FLINK_KEY)])
    def test_an_application_is_created_as_its_kind(
        self, api: FakeApiServer, apps: KubernetesApplications, kind: AppKind, key: str
    ) -> None:
        """The manifest is posted to its resource, where the API server's schema accepts it."""
        apps.create(manifest(kind))
        stored = api.get(key, "j1-app")
        assert stored is not None and stored["metadata"]["namespace"] == "jobs"
        assert apps.phase("j1-app") == "pending"

    def test_creating_twice_is_a_no_op(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """409 AlreadyExists means the earlier attempt landed; the object is unchanged."""
        apps.create(manifest())
        first = api.get(SPARK_KEY, "j1-app")
        apps.create(manifest())
        assert api.get(SPARK_KEY, "j1-app") == first
        posts = [r for r in api.requests if r.startswith("POST /apis/sparkoperator")]
        assert len(posts) == 2

    def test_a_manifest_the_api_refuses_is_invalid(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """422 from the schema is InvalidApplication; nothing is created."""
        bad = manifest()
        del bad["spec"]["sparkVersion"]
        with pytest.raises(InvalidApplication, match="sparkVersion"):
            apps.create(bad)
        assert api.get(SPARK_KEY, "j1-app") is None

    def test_a_manifest_of_another_namespace_is_invalid(self, apps: KubernetesApplications) -> None:
        """The adapter serves one namespace: nothing is sent for another."""
        other = manifest()
        other["metadata"]["namespace"] = "elsewhere"
        with pytest.raises(InvalidApplication, match="elsewhere"):
            apps.create(other)

    def test_an_unknown_kind_is_invalid(self, apps: KubernetesApplications) -> None:
        """Only SparkApplication and FlinkDeployment are applications."""
        with pytest.raises(InvalidApplication):
            apps.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}})

    def test_an_uninstalled_operator_is_reported(self) -> None:
        """404 on create: the API does not serve the resource (no CRD)."""
        with fake_api_server() as bare:
            apps = KubernetesApplications(connect(bare), namespace="jobs")
            with pytest.raises(OperatorMissing, match="CRD"):
                apps.create(manifest())

    def test_an_unreachable_api_is_unavailable(self) -> None:
        """A refused connection is ApplicationsUnavailable."""
        configuration = client.Configuration(host="http://127.0.0.1:9")
        configuration.retries = 0
        apps = KubernetesApplications(client.ApiClient(configuration), namespace="jobs")
        with pytest.raises(ApplicationsUnavailable):
            apps.phase("j1-app")


class TestPhase:
    def test_a_missing_application_is_absent(self, apps: KubernetesApplications) -> None:
        """404 for both kinds is absent."""
        assert apps.phase("nobody") == "absent"

    @pytest.mark.parametrize(
        ("state", "phase"),
        [
            ("SUBMITTED", "pending"),
            ("RUNNING", "running"),
            ("SUCCEEDING", "running"),
            ("COMPLETED", "completed"),
            ("FAILED", "failed"),
            ("SUBMISSION_FAILED", "failed"),
            ("PENDING_RERUN", "pending"),
            ("UNKNOWN", "pending"),
        ],
    )
    def test_spark_states_map_to_phases(
        self, api: FakeApiServer, apps: KubernetesApplications, state: str, phase: str
    ) -> None:
        """status.applicationState.state, as the operator writes it."""
        apps.create(manifest())
        api.set_status(SPARK_KEY, "j1-app", {"applicationState": {"state": state}})
        assert apps.phase("j1-app") == phase

    @pytest.mark.parametrize(
        ("status", "phase"),
        [
            ({"lifecycleState": "CREATED"}, "pending"),
            ({"lifecycleState": "DEPLOYED", "jobStatus": {"state": "INITIALIZING"}}, "pending"),
            ({"lifecycleState": "STABLE", "jobStatus": {"state": "RUNNING"}}, "running"),
            ({"lifecycleState": "STABLE", "jobStatus": {"state": "RESTARTING"}}, "running"),
            ({"lifecycleState": "STABLE", "jobStatus": {"state": "FINISHED"}}, "completed"),
            ({"lifecycleState": "FAILED", "jobStatus": {"state": "FAILED"}}, "failed"),
            ({"lifecycleState": "STABLE", "jobStatus": {"state": "CANCELED"}}, "failed"),
            ({"lifecycleState": "FAILED", "error": "bad spec"}, "failed"),
        ],
        ids=lambda v: json.dumps(v) if isinstance(v, dict) else v,
    )
    def test_flink_states_map_to_phases(
        self,
        api: FakeApiServer,
        apps: KubernetesApplications,
        status: dict[str, Any],
        phase: str,
    ) -> None:
        """status.jobStatus.state and status.lifecycleState, as the operator writes them."""
        apps.create(manifest("flink"))
        api.set_status(FLINK_KEY, "j1-app", status)
        assert apps.phase("j1-app") == phase

    def test_the_status_of_a_created_object_is_the_operators(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """A status sent on create is dropped (status subresource): only the operator's
        counts."""
        sent = manifest()
        sent["status"] = {"applicationState": {"state": "COMPLETED"}}
        apps.create(sent)
        assert apps.phase("j1-app") == "pending"

    def test_a_new_adapter_finds_an_application_of_either_kind(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """A restarted process does not know the kinds: it looks under both."""
        apps.create(manifest("flink"))
        api.set_status(FLINK_KEY, "j1-app", {"jobStatus": {"state": "RUNNING"}})
        assert KubernetesApplications(connect(api), namespace="jobs").phase("j1-app") == "running"

    def test_phase_mappings_default_to_pending(self) -> None:
        """A state neither operator documents reports no progress."""
        assert spark_phase({"status": {"applicationState": {"state": "NEW_ONE"}}}) == "pending"
        assert flink_phase({}) == "pending"


class TestDelete:
    def test_delete_is_foreground_and_the_application_stays_until_its_pods_go(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """The object is marked for deletion (foregroundDeletion) and is absent only once the
        garbage collector has deleted its dependents."""
        apps.create(manifest())
        apps.delete("j1-app")
        [(_, _, options)] = [b for b in api.bodies if b[0] == "DELETE"]
        assert options["propagationPolicy"] == "Foreground"
        stored = api.get(SPARK_KEY, "j1-app")
        assert stored is not None and stored["metadata"]["finalizers"] == ["foregroundDeletion"]
        assert apps.phase("j1-app") != "absent"

        api.remove_finalizer(SPARK_KEY, "j1-app", "foregroundDeletion")

        assert apps.phase("j1-app") == "absent"

    def test_deleting_twice_and_deleting_nothing_are_no_ops(
        self, api: FakeApiServer, apps: KubernetesApplications
    ) -> None:
        """404 is a no-op; a second delete of an object being deleted changes nothing."""
        apps.delete("nobody")
        apps.create(manifest("flink"))
        apps.delete("j1-app")
        apps.delete("j1-app")
        stored = api.get(FLINK_KEY, "j1-app")
        assert stored is not None and stored["metadata"]["finalizers"] == ["foregroundDeletion"]

    def test_background_deletion_removes_the_object_at_once(self, api: FakeApiServer) -> None:
        """With background propagation the object goes now and its dependents after."""
        apps = KubernetesApplications(connect(api), namespace="jobs", propagation="Background")
        apps.create(manifest())
        apps.delete("j1-app")
        assert apps.phase("j1-app") == "absent"
