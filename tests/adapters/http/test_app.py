"""The HTTP API: 202 with ids, status and long-poll, 422 with the field at fault, 409, 404."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud, QuotaExceeded
from fleetledger.adapters.http import create_app
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.domain.grouper import GrouperConfig
from fleetledger.eventstore import EventStore, open_store

FAST = GrouperConfig(
    idle_timeout=timedelta(milliseconds=50),
    max_timeout=timedelta(milliseconds=500),
    max_batch_size=50,
)
SLOW = GrouperConfig(
    idle_timeout=timedelta(minutes=1), max_timeout=timedelta(minutes=5), max_batch_size=50
)


def body(name: str, **fields: object) -> dict[str, object]:
    return {"machine_name": name, "template": {"vm_size": "Standard_D4s_v5"}, **fields}


@contextlib.contextmanager
def serving(
    url: str, *, config: GrouperConfig = FAST, cloud: FakeCloud | None = None
) -> Iterator[tuple[TestClient, EventStore]]:
    with contextlib.closing(open_store(url)) as store:
        runtime = MachinesRuntime(store, cloud or FakeCloud(), clock=SystemClock(), config=config)
        with TestClient(create_app(runtime, manage_runtime=True)) as client:
            yield client, store


@pytest.fixture
def api(sqlite_url: str) -> Iterator[tuple[TestClient, EventStore]]:
    with serving(sqlite_url) as served:
        yield served


@pytest.fixture
def client(api: tuple[TestClient, EventStore]) -> TestClient:
    return api[0]


class TestPost:
    def test_one_request_is_accepted_with_its_id(self, client: TestClient) -> None:
        """202, the request id, and a Location to follow."""
        response = client.post("/v1/machines", json=body("m-1", request_id="r-1"))

        assert response.status_code == 202
        assert response.json() == {"request_ids": ["r-1"], "status_urls": ["/v1/machines/r-1"]}
        assert response.headers["location"] == "/v1/machines/r-1"

    def test_many_requests_are_accepted_in_order(self, client: TestClient) -> None:
        """A list gets its ids back in the same order; missing ids are generated."""
        response = client.post(
            "/v1/machines", json={"requests": [body("m-1", request_id="r-1"), body("m-2")]}
        )

        ids = response.json()["request_ids"]
        assert response.status_code == 202
        assert ids[0] == "r-1" and len(ids) == 2 and ids[1] != "r-1"

    def test_the_request_is_readable_right_after_the_post(self, client: TestClient) -> None:
        """Read-your-writes: the POST returns once the read model has the request."""
        client.post("/v1/machines", json=body("m-1", request_id="r-1"))

        response = client.get("/v1/machines/r-1")

        assert response.status_code == 200
        assert response.json()["machine_name"] == "m-1"

    def test_skip_batching_gives_the_request_its_own_batch(self, client: TestClient) -> None:
        """The seed's context flag, per request in the body."""
        client.post("/v1/machines", json=body("m-1", request_id="r-1", skip_batching=True))

        status = client.get("/v1/machines/r-1", params={"wait": 10}).json()

        assert status["seal_reason"] == "skip"
        assert status["status"] == "created"


class TestInvalidBodies:
    @pytest.mark.parametrize(
        ("payload", "loc"),
        [
            ({"template": {"vm_size": "Standard_D4s_v5"}}, ["body", "requests", 0, "machine_name"]),
            (body("m-1", template={"vm_size": ""}), ["body", "requests", 0, "template", "vm_size"]),
            (
                {"requests": [body("m-1"), body("m-2", zones=["1", "1"])]},
                ["body", "requests", 1, "zones"],
            ),
            (
                body("m-1", template={"vm_size": "D4", "max_pod": 30}),
                ["body", "requests", 0, "template", "max_pod"],
            ),
            ({"requests": []}, ["body", "requests"]),
            (body("m-1", tags={"": "x"}), ["body", "requests", 0, "tags", "", "[key]"]),
        ],
        ids=[
            "missing name",
            "empty vm size",
            "zone twice",
            "unknown field",
            "no requests",
            "empty tag key",
        ],
    )
    def test_422_names_the_field_and_nothing_is_appended(
        self, api: tuple[TestClient, EventStore], payload: object, loc: list[object]
    ) -> None:
        """A body that does not validate is refused whole, pointing at the field at fault."""
        client, store = api

        response = client.post("/v1/machines", json=payload)

        assert response.status_code == 422
        assert loc in [error["loc"] for error in response.json()["detail"]]
        assert store.head() == 0


class TestConflicts:
    def test_a_machine_name_in_use_is_409_and_nothing_is_appended(
        self, api: tuple[TestClient, EventStore]
    ) -> None:
        """The grouper holds a name until its request fails; the whole call is refused."""
        client, store = api
        client.post("/v1/machines", json=body("m-1", request_id="r-1"))
        head = store.head()

        response = client.post(
            "/v1/machines", json={"requests": [body("m-2"), body("m-1", request_id="r-9")]}
        )

        assert response.status_code == 409
        assert response.json()["detail"]["index"] == 1
        assert "m-1" in response.json()["detail"]["reason"]
        assert store.head() == head

    def test_re_sending_a_request_is_idempotent(self, sqlite_url: str) -> None:
        """The same id and content again: 202, nothing new in the log."""
        # Slow timeouts: a seal or a batch result landing between the two posts would move the
        # head for reasons that have nothing to do with the re-send.
        with serving(sqlite_url, config=SLOW) as (client, store):
            client.post("/v1/machines", json=body("m-1", request_id="r-1"))
            head = store.head()

            again = client.post("/v1/machines", json=body("m-1", request_id="r-1"))

            assert again.status_code == 202
            assert store.head() == head


class TestGet:
    def test_wait_returns_the_outcome_as_soon_as_it_is_known(self, client: TestClient) -> None:
        """The long-poll answers with the created machine, well before the wait is over."""
        client.post("/v1/machines", json=body("m-1", request_id="r-1"))
        started = time.monotonic()

        status = client.get("/v1/machines/r-1", params={"wait": 30}).json()

        assert time.monotonic() - started < 10
        assert status["status"] == "created"
        assert status["outcome"]["provider_id"] == "fake://machines/m-1"

    def test_a_failure_is_an_outcome_with_its_error(self, sqlite_url: str) -> None:
        """A refused machine is a 200 with a failed outcome, its code and retry advice."""
        cloud = FakeCloud()
        cloud.fail_machine("m-1", QuotaExceeded("cores quota exceeded"))
        with serving(sqlite_url, cloud=cloud) as (client, _):
            client.post("/v1/machines", json=body("m-1", request_id="r-1"))
            outcome = client.get("/v1/machines/r-1", params={"wait": 30}).json()["outcome"]

        assert outcome["status"] == "failed"
        assert outcome["error"]["code"] == "quota_exceeded"
        assert outcome["error"]["retryable"] is False

    def test_wait_ends_with_the_current_status_when_nothing_happens(self, sqlite_url: str) -> None:
        """With a batch far from due, the long-poll returns 'pending' after the wait."""
        with serving(sqlite_url, config=SLOW) as (client, _):
            client.post("/v1/machines", json=body("m-1", request_id="r-1"))
            status = client.get("/v1/machines/r-1", params={"wait": 0.2}).json()

        assert status["status"] == "pending"
        assert status["outcome"] is None

    def test_an_unknown_request_is_404(self, client: TestClient) -> None:
        """An id never accepted is not found."""
        assert client.get("/v1/machines/r-404").status_code == 404

    def test_wait_is_capped(self, client: TestClient) -> None:
        """More than 60 s of waiting is refused, naming the parameter."""
        client.post("/v1/machines", json=body("m-1", request_id="r-1"))

        response = client.get("/v1/machines/r-1", params={"wait": 61})

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["query", "wait"]


class TestHealth:
    def test_healthz_reports_the_running_grouper(self, client: TestClient) -> None:
        """Liveness answers 200 with the grouper's name."""
        response = client.get("/healthz")

        assert response.status_code == 200
        assert response.json()["grouper"] == "default"


class TestOnEveryBackend:
    def test_post_then_wait_for_the_outcome(self, store_url: str) -> None:
        """The same round trip on SQLite and Postgres."""
        with serving(store_url) as (client, _):
            accepted = client.post(
                "/v1/machines", json={"requests": [body("m-1"), body("m-2")]}
            ).json()
            outcomes = [
                client.get(url, params={"wait": 30}).json()["status"]
                for url in accepted["status_urls"]
            ]

        assert outcomes == ["created", "created"]


class TestSurface:
    def test_exports(self) -> None:
        """``http_adapter.__all__`` is the app factory and the wait cap."""
        from fleetledger.adapters import http as http_adapter

        assert sorted(http_adapter.__all__) == ["MAX_WAIT_SECONDS", "create_app"]
