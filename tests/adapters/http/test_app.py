"""The HTTP API: 202 with ids, status and long-poll, 422 with the field at fault, 409, 404, 503."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud, QuotaExceeded
from fleetledger.adapters.http import create_app
from fleetledger.adapters.http.app import status_url
from fleetledger.adapters.machines import MachineRequest, MachinesRuntime
from fleetledger.domain.machines import GrouperConfig
from fleetledger.domain.template import MachineTemplate
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
def running(
    url: str, *, config: GrouperConfig = FAST, cloud: FakeCloud | None = None
) -> Iterator[tuple[TestClient, MachinesRuntime]]:
    with contextlib.closing(open_store(url)) as store:
        runtime = MachinesRuntime(store, cloud or FakeCloud(), clock=SystemClock(), config=config)
        with TestClient(create_app(runtime, manage_runtime=True)) as client:
            yield client, runtime


@contextlib.contextmanager
def serving(
    url: str, *, config: GrouperConfig = FAST, cloud: FakeCloud | None = None
) -> Iterator[tuple[TestClient, EventStore]]:
    with running(url, config=config, cloud=cloud) as (client, runtime):
        yield client, runtime.store


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
    def test_a_machine_name_in_use_is_409_and_nothing_is_appended(self, sqlite_url: str) -> None:
        """The grouper holds a name until its request fails; the whole call is refused."""
        # Slow timeouts: the first batch sealing between the posts would move the head.
        with serving(sqlite_url, config=SLOW) as (client, store):
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

    def test_a_poison_request_is_refused_and_the_next_one_completes(self, store_url: str) -> None:
        """A NUL in a tag (Postgres cannot store it) is a 422; the controller goes on serving."""
        with serving(store_url) as (client, store):
            refused = client.post("/v1/machines", json=body("m-1", tags={"team": "a\u0000"}))
            head = store.head()
            accepted = client.post("/v1/machines", json=body("m-2", request_id="r-2"))
            outcome = client.get("/v1/machines/r-2", params={"wait": 30}).json()["status"]

        assert refused.status_code == 422
        assert head == 0
        assert accepted.status_code == 202
        assert outcome == "created"


class TestPoison:
    """Whatever can be refused is refused at the edge: 4xx naming the field, nothing appended."""

    @pytest.mark.parametrize(
        ("payload", "loc"),
        [
            (body("m-1", tags={"team": "a\u0000"}), ["body", "requests", 0, "tags", "team"]),
            (body("m-1", request_id="r\u0000"), ["body", "requests", 0, "request_id"]),
            (body("m-1", request_id="機-1"), ["body", "requests", 0, "request_id"]),
            (body("m-1", request_id="a/b"), ["body", "requests", 0, "request_id"]),
            (body("m-1", request_id="a?wait=1"), ["body", "requests", 0, "request_id"]),
            (body("m-1", request_id="   "), ["body", "requests", 0, "request_id"]),
            (body("m\u0007"), ["body", "requests", 0, "machine_name"]),
            (body("   "), ["body", "requests", 0, "machine_name"]),
            (
                body("m-1", template={"vm_size": " \t "}),
                ["body", "requests", 0, "template", "vm_size"],
            ),
            (
                body("m-1", template={"vm_size": "D4", "max_pods": 251}),
                ["body", "requests", 0, "template", "max_pods"],
            ),
            (
                body("m-1", template={"vm_size": "D4", "max_pods": 672.5}),
                ["body", "requests", 0, "template", "max_pods"],
            ),
            (
                body("m-1", template={"vm_size": "D4", "os_disk_size_gb": 4096}),
                ["body", "requests", 0, "template", "os_disk_size_gb"],
            ),
            (
                body("m-1", template={"vm_size": "D4", "os_disk_size_gb": "128"}),
                ["body", "requests", 0, "template", "os_disk_size_gb"],
            ),
            (
                body("m-1", tags={f"k{i}": "v" for i in range(10_000)}),
                ["body", "requests", 0, "tags"],
            ),
            (body("m-1", tags={"a/b": "v"}), ["body", "requests", 0, "tags", "a/b", "[key]"]),
            (body("m-1", tags={"k": "v" * 257}), ["body", "requests", 0, "tags", "k"]),
            (body("m-1", zones=["1", "2", "3", "4"]), ["body", "requests", 0, "zones"]),
        ],
        ids=[
            "NUL in a tag",
            "NUL in the id",
            "id outside the character set",
            "id with a slash",
            "id with a query",
            "blank id",
            "control character in the name",
            "blank name",
            "blank vm size",
            "max_pods over 250",
            "fractional max_pods",
            "disk over 2048 GB",
            "disk size as a string",
            "10,000 tags",
            "tag key Azure refuses",
            "tag value over 256",
            "four zones",
        ],
    )
    def test_refused_with_422_naming_the_field(
        self, api: tuple[TestClient, EventStore], payload: object, loc: list[object]
    ) -> None:
        """The body is refused whole with the field at fault, and the log is untouched."""
        client, store = api

        response = client.post("/v1/machines", json=payload)

        assert response.status_code == 422
        assert loc in [error["loc"] for error in response.json()["detail"]]
        assert store.head() == 0

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"machine_name": "m-1", "template": {"vm_size": "D4", "max_pods": NaN}}',
            b'{"machine_name": "m-1", "template": {"vm_size": "D4", "max_pods": Infinity}}',
            b'{"machine_name": "m-1", "template": {"vm_size": "D4"}, "tags": {"\\udc00": "x"}}',
            b'{"machine_name": "m-1", "template": {"vm_size": "D4"}, "zones": ["\\ud800"]}',
            b'{"machine_name": "m-1", "template": {"vm_size": "D4"}, "tags": {"k": "\\ud800"}}',
            b"[" * 100_000,
            b"\xff\xfe not json",
        ],
        ids=[
            "NaN",
            "Infinity",
            "surrogate key",
            "surrogate zone",
            "surrogate value",
            "deep nesting",
            "not UTF-8",
        ],
    )
    def test_values_json_cannot_carry_are_a_4xx(
        self, api: tuple[TestClient, EventStore], raw: bytes
    ) -> None:
        """Bodies whose echo would break a JSON response get a 4xx in plain ASCII, never a 500."""
        client, store = api

        response = client.post(
            "/v1/machines", content=raw, headers={"Content-Type": "application/json"}
        )

        assert 400 <= response.status_code < 500
        assert response.content.isascii()
        json.loads(response.content)
        assert store.head() == 0

    def test_a_body_over_the_limit_is_413(self, api: tuple[TestClient, EventStore]) -> None:
        """A 10 MB body is refused by size before it is parsed."""
        client, store = api
        payload = body("m-1", tags={"k": "v" * (10 * 1024 * 1024)})

        response = client.post("/v1/machines", json=payload)

        assert response.status_code == 413
        assert store.head() == 0

    def test_an_integral_float_is_an_integer(self, api: tuple[TestClient, EventStore]) -> None:
        """``110.0`` is an integer to JSON Schema, so it is accepted as 110."""
        client, store = api

        response = client.post(
            "/v1/machines", json=body("m-1", template={"vm_size": "D4", "max_pods": 110.0})
        )

        assert response.status_code == 202
        assert store.head() > 0


class TestKeptRequests:
    def test_every_allowed_id_gives_a_working_status_url(self, client: TestClient) -> None:
        """An id using each allowed punctuation character is found at its Location."""
        response = client.post("/v1/machines", json=body("m-1", request_id="A.b_c:d~e-1"))

        location = response.headers["location"]
        assert response.status_code == 202
        assert client.get(location).json()["request_id"] == "A.b_c:d~e-1"

    def test_ids_taken_through_other_doors_are_encoded_in_their_url(self, sqlite_url: str) -> None:
        """An id the API would refuse, kept through the runtime, still has a working URL."""
        with running(sqlite_url, config=SLOW) as (client, runtime):
            template = MachineTemplate(vm_size="Standard_D4s_v5")
            runtime.service.request(
                [MachineRequest(request_id="機/1?x", machine_name="m-1", template=template)]
            )

            url = status_url("機/1?x")
            response = client.get(url)

        assert url == "/v1/machines/%E6%A9%9F%2F1%3Fx"
        assert response.status_code == 200
        assert response.json()["request_id"] == "機/1?x"

    def test_a_kept_request_is_not_answered_with_an_error(
        self, sqlite_url: str, tmp_path: Path
    ) -> None:
        """A repeat of a request the log has is 202 even when the log cannot be read after."""
        with running(sqlite_url, config=SLOW) as (client, runtime):
            client.post("/v1/machines", json=body("m-1", request_id="r-1"))
            for file in tmp_path.glob("fleetledger.db*"):
                file.unlink()
            runtime.store.close()

            again = client.post("/v1/machines", json=body("m-1", request_id="r-1"))

        assert again.status_code == 202
        assert again.json()["request_ids"] == ["r-1"]

    def test_a_status_read_right_after_the_202_finds_the_request(self, sqlite_url: str) -> None:
        """The POST does not wait for the read model; a GET the model cannot answer yet
        catches it up from the log instead of answering 404."""
        with running(sqlite_url, config=SLOW) as (client, runtime):
            runtime._follower.stop()  # the model folds nothing on its own from here
            posted = client.post("/v1/machines", json=body("m-1", request_id="r-1"))
            unfolded = runtime.projection.get("r-1")

            status = client.get(posted.headers["location"])

        assert posted.status_code == 202 and unfolded is None
        assert status.status_code == 200
        assert status.json()["request_id"] == "r-1"

    def test_a_log_read_failure_is_503_with_retry_after(
        self, sqlite_url: str, tmp_path: Path
    ) -> None:
        """A read the log cannot answer is 'try again', not an internal error."""
        with running(sqlite_url, config=SLOW) as (client, runtime):
            # The database goes away under the server: its next connection finds no log.
            for file in tmp_path.glob("fleetledger.db*"):
                file.unlink()
            runtime.store.close()

            response = client.get("/v1/machines/never-seen")

        assert response.status_code == 503
        assert int(response.headers["retry-after"]) > 0


class TestConfiguration:
    @pytest.mark.parametrize(
        ("options", "advice"),
        [
            ({"api_tokens": ["short"]}, "at least"),
            ({"api_tokens": []}, "FLEETLEDGER_API_TOKENS"),
            ({"max_body_bytes": 0}, "positive number of bytes"),
        ],
        ids=["short token", "empty token list", "zero body limit"],
    )
    def test_bad_options_are_refused_when_the_app_is_built(
        self, sqlite_url: str, options: dict[str, object], advice: str
    ) -> None:
        """Not at the first request: ``create_app`` itself says what to fix."""
        with contextlib.closing(open_store(sqlite_url)) as store:
            runtime = MachinesRuntime(store, FakeCloud(), clock=SystemClock())
            with pytest.raises(ValueError, match=advice):
                create_app(runtime, **options)  # type: ignore[arg-type]
