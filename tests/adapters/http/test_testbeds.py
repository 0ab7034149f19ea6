"""The external scheduler's HTTP interface: testbeds, jobs and schedulings, mounted in the app."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.http import create_app
from fleetledger.adapters.http import testbeds as testbeds_http
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.adapters.testbeds import FakeApplications, TestbedsRuntime
from fleetledger.eventstore import EventStore, open_store
from tests.adapters.http.schema_checks import REFUSALS
from tests.adapters.testbeds.support import two_nodes

CHECKS: list[Any] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
BED = {
    "name": "bed",
    "node_label": "testbed",
    "slots_per_node": 2,
    "slot": {"cpu_millis": 1000, "memory_mib": 2048},
}


def job(name: str, **fields: object) -> dict[str, object]:
    return {
        "name": name,
        "kind": "spark",
        "image": "spark:3.5",
        "main_file": f"/{name}.py",
    } | fields


def queue(name: str, *jobs: str, testbed: str = "bed") -> dict[str, object]:
    return {"name": name, "testbed": testbed, "strategy": "queue", "queue": list(jobs)}


@dataclass
class Api:
    client: TestClient
    store: EventStore
    runtime: TestbedsRuntime

    def post(self, path: str, body: object) -> Any:
        return self.client.post(path, json=body)

    def hold(self, scheduling: str) -> None:
        """The leader's pass for one scheduling: it claims its jobs and testbed."""
        self.runtime.process.advance(scheduling)


@contextlib.contextmanager
def serving(store: EventStore) -> Iterator[Api]:
    cluster = two_nodes()
    runtime = TestbedsRuntime(
        store, cluster, FakeApplications(cluster), clock=SystemClock(), threads=False
    ).start()
    # The machines runtime is not started: nothing but these tests' requests appends.
    machines = MachinesRuntime(store, FakeCloud(), clock=SystemClock())
    app = create_app(machines, routers=[testbeds_http.testbeds_router(runtime)])
    try:
        with TestClient(app) as client:
            yield Api(client, store, runtime)
    finally:
        runtime.stop()


@pytest.fixture
def api(store: EventStore) -> Iterator[Api]:
    with serving(store) as served:
        yield served


@pytest.fixture
def ready(api: Api) -> Api:
    """A testbed and three jobs."""
    assert api.post("/v1/testbeds", BED).status_code == 201
    for name in ("j1", "j2", "j3"):
        assert api.post("/v1/jobs", job(name)).status_code == 201
    return api


class TestTestbeds:
    def test_create_answers_201_with_where_it_landed(self, api: Api) -> None:
        """The event is in the log before the answer; the answer says where."""
        response = api.post("/v1/testbeds", BED)

        body = response.json()
        assert response.status_code == 201
        assert body["appended"] is True
        assert body["position"] == api.store.head()
        assert body["testbed"]["created_position"] == body["position"]
        assert body["testbed"]["slot"] == {"cpu_millis": 1000, "memory_mib": 2048}

    def test_a_repeat_is_200_and_appends_nothing(self, api: Api) -> None:
        """The same definition again changes nothing and says so."""
        first = api.post("/v1/testbeds", BED).json()
        head = api.store.head()

        response = api.post("/v1/testbeds", BED)

        assert response.status_code == 200
        assert (response.json()["appended"], response.json()["position"]) == (
            False,
            first["position"],
        )
        assert api.store.head() == head

    def test_another_shape_resizes_it(self, api: Api) -> None:
        """A testbed may be resized: 200, a new event, the new shape."""
        api.post("/v1/testbeds", BED)

        response = api.post("/v1/testbeds", BED | {"slots_per_node": 3})

        assert response.status_code == 200
        assert response.json()["appended"] is True
        assert response.json()["testbed"]["slots_per_node"] == 3

    def test_get_shows_slots_state_and_problems(self, api: Api) -> None:
        """Once the reconciler has observed the nodes, the slots are listed with their nodes."""
        api.post("/v1/testbeds", BED)
        api.runtime.reconciler.reconcile("bed")

        body = api.client.get("/v1/testbeds/bed").json()

        assert body["holder"] is None
        assert body["problems"] == []
        assert body["state"] in ("in_progress", "success")
        assert [(s["id"], s["node"], s["position_on_node"]) for s in body["slots"]] == [
            (0, "n1", 0),
            (1, "n2", 0),
            (2, "n1", 1),
            (3, "n2", 1),
        ]
        assert {s["pod"] for s in body["slots"]} == {None}

    def test_unknown_is_404(self, api: Api) -> None:
        """A name never defined is not found, whatever the method."""
        assert api.client.get("/v1/testbeds/nope").status_code == 404
        assert api.client.delete("/v1/testbeds/nope").status_code == 404

    def test_delete_removes_it(self, api: Api) -> None:
        """Deleted: 200 with where, then 404 and gone from the list; again changes nothing."""
        api.post("/v1/testbeds", BED)

        deleted = api.client.delete("/v1/testbeds/bed")
        head = api.store.head()
        again = api.client.delete("/v1/testbeds/bed")

        assert (deleted.status_code, deleted.json()["appended"]) == (200, True)
        assert deleted.json()["position"] == head
        assert api.client.get("/v1/testbeds/bed").status_code == 404
        assert api.client.get("/v1/testbeds").json()["items"] == []
        assert (again.status_code, again.json()["appended"]) == (200, False)
        assert api.store.head() == head

    def test_delete_of_a_held_testbed_is_409_naming_the_holder(self, ready: Api) -> None:
        """A scheduling holds it: refused, the holder named, nothing appended."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")
        head = ready.store.head()

        response = ready.client.delete("/v1/testbeds/bed")

        assert response.status_code == 409
        assert response.json()["detail"]["holder"] == "s1"
        assert "s1" in response.json()["detail"]["reason"]
        assert ready.store.head() == head


class TestJobs:
    def test_create_and_get(self, api: Api) -> None:
        """201 with the job; GET shows it ready, held by nobody, no application yet."""
        created = api.post("/v1/jobs", job("j1", arguments=["--n", "10"]))

        body = api.client.get("/v1/jobs/j1").json()
        assert created.status_code == 201
        assert body["status"] == "ready"
        assert (body["holder"], body["application"], body["slots"]) == (None, None, [])
        assert body["arguments"] == ["--n", "10"]
        assert body["position"] == created.json()["position"]

    def test_same_name_with_another_spec_is_409(self, api: Api) -> None:
        """A job's spec does not change under its name: 409, nothing appended."""
        api.post("/v1/jobs", job("j1"))
        head = api.store.head()

        response = api.post("/v1/jobs", job("j1", image="spark:4.0"))

        assert response.status_code == 409
        assert "another spec" in response.json()["detail"]["reason"]
        assert api.store.head() == head

    def test_per_job_resources_are_refused(self, api: Api) -> None:
        """The slot size comes from the testbed: a job's own resources are an unknown field."""
        response = api.post("/v1/jobs", job("j1", cpu_millis=500))

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "cpu_millis"]
        assert api.store.head() == 0

    def test_delete_of_a_held_job_is_409_naming_the_holder(self, ready: Api) -> None:
        """A job a scheduling holds cannot be deleted; a free one can."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")
        head = ready.store.head()

        held = ready.client.delete("/v1/jobs/j1")
        assert ready.store.head() == head
        free = ready.client.delete("/v1/jobs/j2")

        assert held.status_code == 409
        assert held.json()["detail"]["holder"] == "s1"
        assert (free.status_code, free.json()["appended"]) == (200, True)
        assert ready.client.get("/v1/jobs/j2").status_code == 404

    def test_a_held_job_shows_its_holder(self, ready: Api) -> None:
        """Once claimed, the job is in its scheduling's queue."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")

        body = ready.client.get("/v1/jobs/j1").json()

        assert (body["status"], body["holder"]) == ("in_queue", "s1")

    def test_a_new_job_has_no_runs_yet(self, ready: Api) -> None:
        """``runs`` lists the runs that ended; a job never run lists none (the end-to-end test
        shows completed runs)."""
        assert ready.client.get("/v1/jobs/j1").json()["runs"] == []


class TestSchedulings:
    def test_create_answers_201_and_shows_the_queue(self, ready: Api) -> None:
        """A queue-based scheduling: acquiring, its queue and jobs listed."""
        response = ready.post("/v1/schedulings", queue("s1", "j1", "j1", "j2"))

        body = response.json()["scheduling"]
        assert response.status_code == 201
        assert (body["phase"], body["strategy"], body["testbed"]) == ("acquire", "queue", "bed")
        assert body["queue"] == ["j1", "j1", "j2"]
        assert [(j["name"], j["status"]) for j in body["jobs"]] == [
            ("j1", "ready"),
            ("j2", "ready"),
        ]

    def test_a_job_held_elsewhere_is_409_and_nothing_is_appended(self, ready: Api) -> None:
        """Immediate feedback instead of a scheduling that waits: the holder is named."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")
        head = ready.store.head()

        response = ready.post("/v1/schedulings", queue("s2", "j2", "j1"))

        assert response.status_code == 409
        assert response.json()["detail"]["holder"] == "s1"
        assert response.json()["detail"]["reason"].startswith("job j1 is held by scheduling s1")
        assert ready.store.head() == head
        assert ready.client.get("/v1/schedulings/s2").status_code == 404

    def test_a_repeat_is_200_even_once_its_jobs_are_held(self, ready: Api) -> None:
        """Its own claims do not make a repeated create conflict."""
        first = ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")
        head = ready.store.head()

        again = ready.post("/v1/schedulings", queue("s1", "j1"))

        assert first.status_code == 201
        assert (again.status_code, again.json()["appended"]) == (200, False)
        assert ready.store.head() == head

    def test_same_name_with_other_jobs_is_409(self, ready: Api) -> None:
        """A scheduling's jobs do not change under its name (extend it instead)."""
        ready.post("/v1/schedulings", queue("s1", "j1"))

        response = ready.post("/v1/schedulings", queue("s1", "j2"))

        assert response.status_code == 409

    @pytest.mark.parametrize(
        ("body", "loc"),
        [
            (queue("s1", "j1", "nope"), ["body", "queue", 1]),
            (queue("s1", "j1", testbed="nobed"), ["body", "testbed"]),
            (
                {
                    "name": "s1",
                    "testbed": "bed",
                    "strategy": "slots_strict",
                    "items": [{"job": "nope", "slot_ids": [0]}],
                },
                ["body", "items", 0, "job"],
            ),
        ],
        ids=["unknown job", "unknown testbed", "unknown job in an item"],
    )
    def test_a_missing_reference_is_422_at_its_place(
        self, ready: Api, body: dict[str, object], loc: list[object]
    ) -> None:
        """What does not exist is pointed at in the body; nothing is appended."""
        head = ready.store.head()

        response = ready.post("/v1/schedulings", body)

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == loc
        assert ready.store.head() == head

    def test_the_strategy_decides_queue_or_items(self, ready: Api) -> None:
        """Slot items in a queue-based scheduling are refused at ``items``."""
        body = queue("s1", "j1") | {"items": [{"job": "j2", "slot_ids": [0, 1]}]}

        response = ready.post("/v1/schedulings", body)

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "items"]

    def test_slot_items_are_recorded(self, ready: Api) -> None:
        """A slot-based scheduling keeps its items until they start."""
        body = {
            "name": "s1",
            "testbed": "bed",
            "strategy": "slots_relaxed",
            "items": [{"job": "j1", "slot_ids": [0, 2]}, {"job": "j2", "slot_ids": [1]}],
        }

        response = ready.post("/v1/schedulings", body)

        assert response.status_code == 201
        assert response.json()["scheduling"]["items"] == [
            {"job": "j1", "slot_ids": [0, 2]},
            {"job": "j2", "slot_ids": [1]},
        ]

    def test_extend_adds_to_the_queue(self, ready: Api) -> None:
        """Online scheduling: the running scheduling takes another job."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")

        response = ready.post("/v1/schedulings/s1/queue", {"queue": ["j2"]})

        body = response.json()
        assert (response.status_code, body["appended"]) == (200, True)
        assert body["position"] == ready.store.head()
        assert [j["name"] for j in body["scheduling"]["jobs"]] == ["j1", "j2"]

    def test_the_same_extension_again_appends_nothing(self, ready: Api) -> None:
        """A client's retry of an extension is answered as a repeat."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.post("/v1/schedulings/s1/queue", {"queue": ["j2", "j2"]})
        head = ready.store.head()

        again = ready.post("/v1/schedulings/s1/queue", {"queue": ["j2", "j2"]})

        assert (again.status_code, again.json()["appended"]) == (200, False)
        assert again.json()["position"] == head == ready.store.head()

    def test_a_job_already_in_the_scheduling_with_another_count_is_422(self, ready: Api) -> None:
        """Not a repeat: the domain refuses a job twice in one scheduling."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.post("/v1/schedulings/s1/queue", {"queue": ["j2"]})
        head = ready.store.head()

        response = ready.post("/v1/schedulings/s1/queue", {"queue": ["j2", "j2"]})

        assert response.status_code == 422
        assert "already in the scheduling" in response.json()["detail"][0]["msg"]
        assert ready.store.head() == head

    def test_extend_with_a_job_held_elsewhere_is_409(self, ready: Api) -> None:
        """The same immediate refusal as on create."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")
        ready.post("/v1/schedulings", queue("s2", "j2"))
        head = ready.store.head()

        response = ready.post("/v1/schedulings/s2/queue", {"queue": ["j1"]})

        assert response.status_code == 409
        assert response.json()["detail"]["holder"] == "s1"
        assert ready.store.head() == head

    def test_extend_an_unknown_scheduling_is_404(self, ready: Api) -> None:
        assert ready.post("/v1/schedulings/nope/queue", {"queue": ["j1"]}).status_code == 404

    def test_delete_releases_it(self, ready: Api) -> None:
        """Released: finished, its jobs and testbed free; again changes nothing."""
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.hold("s1")

        released = ready.client.delete("/v1/schedulings/s1")
        head = ready.store.head()
        again = ready.client.delete("/v1/schedulings/s1")

        assert (released.status_code, released.json()["appended"]) == (200, True)
        assert released.json()["scheduling"]["phase"] == "finished"
        assert ready.client.get("/v1/jobs/j1").json()["holder"] is None
        assert ready.client.get("/v1/testbeds/bed").json()["holder"] is None
        assert (again.status_code, again.json()["appended"]) == (200, False)
        assert ready.store.head() == head

    def test_delete_an_unknown_scheduling_is_404(self, api: Api) -> None:
        assert api.client.delete("/v1/schedulings/nope").status_code == 404


class TestListing:
    def test_pages_follow_creation_order_without_gaps_or_repeats(self, api: Api) -> None:
        """Paging by ``next_after`` visits each testbed once, in the order created, while
        testbeds change and new ones are created between pages."""
        for index in range(5):
            api.post("/v1/testbeds", BED | {"name": f"b{index}"})
        seen: list[str] = []
        after: int | None = 0
        while after is not None:
            page = api.client.get("/v1/testbeds", params={"after": after, "limit": 2}).json()
            seen += [item["name"] for item in page["items"]]
            after = page["next_after"]
            if len(seen) == 2:
                # A change keeps a testbed's place; a new one comes on a later page.
                api.post("/v1/testbeds", BED | {"name": "b0", "slots_per_node": 5})
                api.post("/v1/testbeds", BED | {"name": "late"})

        assert seen == ["b0", "b1", "b2", "b3", "b4", "late"]

    def test_the_last_page_says_so(self, ready: Api) -> None:
        """``next_after`` is null once nothing is left."""
        page = ready.client.get("/v1/jobs", params={"limit": 3}).json()

        assert [item["name"] for item in page["items"]] == ["j1", "j2", "j3"]
        assert page["next_after"] is None

    def test_a_full_page_points_at_the_next(self, ready: Api) -> None:
        """A page of ``limit`` items with more behind it carries the last item's position."""
        page = ready.client.get("/v1/jobs", params={"limit": 2}).json()
        rest = ready.client.get("/v1/jobs", params={"after": page["next_after"]}).json()

        assert page["next_after"] == page["items"][-1]["created_position"]
        assert [item["name"] for item in rest["items"]] == ["j3"]

    def test_schedulings_are_listed(self, ready: Api) -> None:
        ready.post("/v1/schedulings", queue("s1", "j1"))
        ready.post("/v1/schedulings", queue("s2", "j2"))

        page = ready.client.get("/v1/schedulings").json()

        assert [item["name"] for item in page["items"]] == ["s1", "s2"]

    @pytest.mark.parametrize(
        ("params", "loc"),
        [({"limit": 501}, ["query", "limit"]), ({"after": -1}, ["query", "after"])],
        ids=["limit over 500", "negative position"],
    )
    def test_bad_paging_is_422(self, api: Api, params: dict[str, int], loc: list[str]) -> None:
        response = api.client.get("/v1/jobs", params=params)

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == loc


BAD_BODIES = [
    ("/v1/testbeds", BED | {"name": "Bed"}, ["body", "name"]),
    ("/v1/testbeds", BED | {"slots_per_node": 0}, ["body", "slots_per_node"]),
    ("/v1/testbeds", BED | {"slots_per_node": "2"}, ["body", "slots_per_node"]),
    ("/v1/testbeds", BED | {"slot": {"cpu_millis": 1000}}, ["body", "slot", "memory_mib"]),
    ("/v1/testbeds", BED | {"node_label": "a label"}, ["body", "node_label"]),
    ("/v1/testbeds", BED | {"spare": 1}, ["body", "spare"]),
    ("/v1/jobs", job("j1", kind="hadoop"), ["body", "kind"]),
    ("/v1/jobs", job("j1", image="spark\ud800"), ["body", "image"]),
    ("/v1/jobs", job("j1", main_file=""), ["body", "main_file"]),
    ("/v1/jobs", job("j1", arguments=["ok", "nul\x00"]), ["body", "arguments", 1]),
    ("/v1/jobs", job("x" * 60), ["body", "name"]),
    ("/v1/schedulings", queue("s1", "j1") | {"strategy": "lifo"}, ["body", "strategy"]),
    (
        "/v1/schedulings",
        {"name": "s1", "testbed": "bed", "strategy": "slots_strict", "items": [{"job": "j1"}]},
        ["body", "items", 0, "slot_ids"],
    ),
    (
        "/v1/schedulings",
        {
            "name": "s1",
            "testbed": "bed",
            "strategy": "slots_strict",
            "items": [{"job": "j1", "slot_ids": [1, 1]}],
        },
        ["body", "items", 0, "slot_ids"],
    ),
]


class TestBadInput:
    @pytest.mark.parametrize(
        ("path", "body", "loc"),
        BAD_BODIES,
        ids=[
            "upper-case name",
            "no slots",
            "slots as text",
            "slot without memory",
            "label with a space",
            "unknown field",
            "unknown kind",
            "lone surrogate",
            "empty main file",
            "NUL in an argument",
            "job name too long",
            "unknown strategy",
            "item without slots",
            "a slot twice",
        ],
    )
    def test_is_422_at_the_field_and_appends_nothing(
        self, ready: Api, path: str, body: dict[str, object], loc: list[object]
    ) -> None:
        """The field at fault is named, the input not echoed back, the log unchanged."""
        head = ready.store.head()

        response = ready.client.post(
            path,
            content=_json_with_surrogates(body),
            headers={"Content-Type": "application/json"},
        )

        assert response.status_code == 422
        detail = response.json()["detail"]
        assert detail[0]["loc"] == loc
        assert all("input" not in error for error in detail)
        assert ready.store.head() == head

    def test_a_body_that_is_not_json_is_422(self, api: Api) -> None:
        response = api.client.post(
            "/v1/testbeds", content=b"{not json", headers={"Content-Type": "application/json"}
        )

        assert response.status_code == 422
        assert api.store.head() == 0


def _json_with_surrogates(body: object) -> bytes:
    import json

    # ensure_ascii writes a lone surrogate as an escape, which is valid JSON text.
    return json.dumps(body, ensure_ascii=True).encode()


class TestLogUnreachable:
    def test_a_read_is_503_with_retry_after(self, sqlite_url: str, tmp_path: Path) -> None:
        """The database goes away under the server: 'try again', not an internal error."""
        with contextlib.closing(open_store(sqlite_url)) as store, serving(store) as api:
            for file in tmp_path.glob("fleetledger.db*"):
                file.unlink()
            store.close()

            response = api.client.get("/v1/testbeds/bed")

        assert response.status_code == 503
        assert int(response.headers["retry-after"]) > 0


def all_operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def run_cases(operation: Any, mode: GenerationMode, examples: int, test: Any) -> None:
    """Run ``test(case)`` over ``examples`` cases hypothesis draws for ``operation``."""

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Case[Any]) -> None:
        test(case)

    run()


class TestSchemaAgreesWithBehaviour:
    @pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    def test_no_5xx_and_refusals_append_nothing(
        self, sqlite_store: EventStore, mode: GenerationMode
    ) -> None:
        """Every call conforms to the schema (statuses, headers, bodies; schema-violating input
        refused), none is a 5xx, and a refused call leaves the log as it was."""
        with serving(sqlite_store) as api:
            # Something to find, claim and conflict with.
            api.post("/v1/testbeds", BED)
            api.post("/v1/jobs", job("j1"))
            api.post("/v1/schedulings", queue("s1", "j1"))
            api.hold("s1")
            schema = schemathesis.openapi.from_asgi(
                "/openapi.json", api.client.app, config=REFUSALS
            )

            def check(case: Case[Any]) -> None:
                before = sqlite_store.head()
                response = case.call_and_validate(checks=CHECKS)
                if response.status_code >= 400:
                    assert sqlite_store.head() == before, f"{response.status_code}, appended"

            operations = [
                operation
                for operation in all_operations(schema)
                if operation.path.startswith(("/v1/testbeds", "/v1/jobs", "/v1/schedulings"))
            ]
            assert len(operations) == 13
            for operation in operations:
                # A name in the path may be any text: a GET or DELETE of one has no invalid form.
                if (
                    mode is GenerationMode.POSITIVE
                    or operation.method == "post"
                    or "{" not in (operation.path)
                ):
                    run_cases(operation, mode, 20, check)
