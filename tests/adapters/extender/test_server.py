"""The extender over HTTP: golden JSON in and out, reservations in the log, the API's edge rules."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fleetledger.adapters.extender.server import (
    ExtenderDecider,
    check_extender_exposure,
    create_extender_app,
    extender_tokens,
)
from fleetledger.adapters.http.auth import ApiTokens
from fleetledger.adapters.testbeds import TestbedsService
from fleetledger.domain.testbeds import PodToPlace, filter_pod, testbed
from fleetledger.eventstore import EventStore, StoreUnavailable, open_store
from tests.adapters.testbeds.support import BED, World, world
from tests.waiting import wait_until

TOKEN = "extender-token-0123456789abcdef"


def pod_json(name: str, uid: str, slot_ids: str = "1,3") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "jobs",
            "uid": uid,
            "annotations": {"fleetledger.io/testbed": BED, "fleetledger.io/slot-ids": slot_ids},
        },
        "spec": {"schedulerName": "fleetledger"},
    }


def seed_pod_json(name: str, uid: str, slot_ids: str) -> dict[str, Any]:
    """A pod written for the original operator: its slot request is in labels."""
    return {
        "metadata": {
            "name": name,
            "namespace": "jobs",
            "uid": uid,
            "labels": {
                "batchjob.tuberlin.de/slots-resource-name": BED,
                "batchjob.tuberlin.de/slots-ids": slot_ids,
            },
        }
    }


def meta_victims(*nodes: str) -> dict[str, object]:
    return {n: {"Pods": [{"UID": f"victim-on-{n}"}], "NumPDBViolations": 0} for n in nodes}


@pytest.fixture
def w(store: EventStore) -> World:
    """A testbed of 2 × 2 slots with its ghost pods running."""
    w = world(store)
    w.runtime.reconciler.reconcile(BED)
    return w


@pytest.fixture
def client(w: World) -> TestClient:
    return TestClient(create_extender_app(w.service))


def ghost_uid(w: World, node: str, position: int) -> str:
    pod = w.cluster.pod(f"bed-ghost-{node}-{position}-1000m-2048mi")
    assert pod is not None
    return pod.uid


def log_head(w: World) -> int:
    return w.store.head()


class TestFilter:
    def test_node_cache_capable_golden(self, w: World, client: TestClient) -> None:
        """Node names in, node names out: the node of the first free slot of the pod's list,
        the other candidates failed with the reason."""
        body = {"Pod": pod_json("j1-app-exec-1", "u1"), "Nodes": None, "NodeNames": ["n1", "n2"]}

        response = client.post("/filter", json=body)

        assert response.status_code == 200
        assert response.json() == json.loads(
            """{"Nodes": null, "NodeNames": ["n2"],
                "FailedNodes": {"n1": "pod j1-app-exec-1 has slot 1, which is on node n2"},
                "FailedAndUnresolvableNodes": {}, "Error": ""}"""
        )
        reserved = testbed.reservation_of(w.service.testbed(BED).state, "j1-app-exec-1")
        assert reserved is not None and reserved.slot_id == 1

    def test_the_reservation_is_in_the_log_before_the_answer(
        self, w: World, client: TestClient
    ) -> None:
        """Another process reading the log right after the answer finds the reservation."""
        client.post("/filter", json={"Pod": pod_json("p", "u1"), "NodeNames": ["n1", "n2"]})

        other = TestbedsService(w.store, clock=w.clock)
        other.catch_up()
        reserved = testbed.reservation_of(other.testbed(BED).state, "p")
        assert reserved is not None and reserved.node == "n2"

    def test_whole_nodes_golden(self, client: TestClient) -> None:
        """Whole nodes in, the passing node object out exactly as received."""
        n1 = {"metadata": {"name": "n1", "labels": {"testbed": "1"}}}
        n2 = {"metadata": {"name": "n2", "labels": {"testbed": "2"}}, "status": {"x": 1}}
        body = {"Pod": pod_json("p", "u1"), "Nodes": {"items": [n1, n2]}, "NodeNames": None}

        answer = client.post("/filter", json=body).json()

        assert answer["Nodes"] == {"items": [n2]}
        assert answer["NodeNames"] is None

    def test_a_pod_of_the_original_operator_is_placed_by_its_labels(
        self, w: World, client: TestClient
    ) -> None:
        """Slot ids joined by underscores in the seed's label place the pod like annotations."""
        body = {"Pod": seed_pod_json("spark-exec-1", "u9", "2_3"), "NodeNames": ["n1", "n2"]}

        answer = client.post("/filter", json=body).json()

        assert answer["NodeNames"] == ["n1"]
        reserved = testbed.reservation_of(w.service.testbed(BED).state, "spark-exec-1")
        assert reserved is not None and reserved.slot_id == 2

    def test_asking_again_keeps_the_reservation(self, w: World, client: TestClient) -> None:
        """A pod asked about twice gets the same node and no second reservation."""
        body = {"Pod": pod_json("p", "u1"), "Nodes": None, "NodeNames": ["n1", "n2"]}
        client.post("/filter", json=body)
        head = log_head(w)

        assert client.post("/filter", json=body).json()["NodeNames"] == ["n2"]
        assert log_head(w) == head

    def test_pods_of_one_application_take_distinct_slots(self, client: TestClient) -> None:
        """Two pods with the same slot list get one slot each; a third finds none free and
        every candidate fails with the reason."""
        answers = [
            client.post(
                "/filter",
                json={"Pod": pod_json(f"p{i}", f"u{i}"), "Nodes": None, "NodeNames": ["n1", "n2"]},
            ).json()
            for i in range(3)
        ]

        assert [a["NodeNames"] for a in answers] == [["n2"], ["n2"], []]
        assert set(answers[2]["FailedNodes"]) == {"n1", "n2"}
        assert "no free slot for pod p2" in answers[2]["FailedNodes"]["n1"]

    def test_a_pod_without_a_slot_request_gets_an_error(self, client: TestClient) -> None:
        """Only a batch job's pods use this scheduler: others are answered with Error."""
        pod = {"metadata": {"name": "web", "namespace": "d", "uid": "u"}}
        answer = client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]}).json()

        assert answer["NodeNames"] == []
        assert "lacks the fleetledger.io/testbed" in answer["Error"]

    def test_an_unknown_testbed_fails_every_node(self, client: TestClient) -> None:
        """A pod naming a testbed that does not exist is placed nowhere, with the reason."""
        pod = pod_json("p", "u")
        pod["metadata"]["annotations"]["fleetledger.io/testbed"] = "other"
        answer = client.post("/filter", json={"Pod": pod, "NodeNames": ["n1"]}).json()

        assert answer["FailedNodes"] == {
            "n1": "no testbed named other; define it before scheduling its jobs' pods"
        }


class TestPreempt:
    def test_meta_victims_golden(self, w: World, client: TestClient) -> None:
        """The pod's slot's node, with that slot's ghost pod as the only victim."""
        body = {
            "Pod": pod_json("p", "u1", "2"),
            "NodeNameToVictims": None,
            "NodeNameToMetaVictims": meta_victims("n1", "n2"),
        }

        response = client.post("/preempt", json=body)

        assert response.status_code == 200
        assert response.json() == {
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": ghost_uid(w, "n1", 1)}], "NumPDBViolations": 0}
            }
        }

    def test_whole_victims_are_answered_with_meta_victims(
        self, w: World, client: TestClient
    ) -> None:
        """Args with whole victim pods (not node-cache-capable) get the same answer."""
        body = {
            "Pod": seed_pod_json("p", "u1", "0"),
            "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": "x"}}]}},
            "NodeNameToMetaVictims": None,
        }

        answer = client.post("/preempt", json=body).json()

        assert answer == {
            "NodeNameToMetaVictims": {
                "n1": {"Pods": [{"UID": ghost_uid(w, "n1", 0)}], "NumPDBViolations": 0}
            }
        }

    def test_only_the_schedulers_candidates_are_answered(
        self, w: World, client: TestClient
    ) -> None:
        """A pod whose free slot is on a node the scheduler did not list preempts nothing, and
        reserves nothing."""
        head = log_head(w)
        body = {"Pod": pod_json("p", "u1", "1"), "NodeNameToMetaVictims": meta_victims("n1")}

        answer = client.post("/preempt", json=body).json()

        assert answer == {"NodeNameToMetaVictims": {}}
        assert log_head(w) == head

    def test_no_free_slot_means_no_node(self, client: TestClient) -> None:
        """When every slot of the pod is taken there is nothing to preempt."""
        victims = meta_victims("n1", "n2")
        client.post(
            "/preempt", json={"Pod": pod_json("a", "ua", "0"), "NodeNameToMetaVictims": victims}
        )

        answer = client.post(
            "/preempt", json={"Pod": pod_json("b", "ub", "0"), "NodeNameToMetaVictims": victims}
        ).json()

        assert answer == {"NodeNameToMetaVictims": {}}

    def test_a_preemptor_without_a_slot_request_is_a_422(self, client: TestClient) -> None:
        """There is no Error field in a preemption result: the call is refused, naming where
        the request should have been."""
        pod = {"metadata": {"name": "web", "namespace": "d", "uid": "u"}}
        response = client.post(
            "/preempt", json={"Pod": pod, "NodeNameToMetaVictims": meta_victims("n1")}
        )

        assert response.status_code == 422
        [detail] = response.json()["detail"]
        assert detail["loc"] == ["body", "Pod", "metadata", "annotations"]


HOSTILE_BODIES: list[tuple[str, bytes]] = [
    ("empty", b""),
    ("not JSON", b"{"),
    ("a list", b"[]"),
    ("null", b"null"),
    ("NaN", b'{"Pod": NaN}'),
    ("a lone surrogate", b'{"Pod": {"metadata": {"name": "\\ud800"}}, "NodeNames": []}'),
    ("invalid UTF-8", b'{"Pod": "\xff"}'),
    ("deep nesting", b"[" * 5000 + b"]" * 5000),
    ("a pod without metadata", b'{"Pod": {}, "NodeNames": []}'),
    ("a pod that is a list", b'{"Pod": [], "NodeNames": []}'),
    ("node names as text", b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": "n1"}'),
    ("a node that is a number", b'{"Pod": {"metadata": {"name": "p"}}, "Nodes": {"items": [1]}}'),
    ("no nodes at all", b'{"Pod": {"metadata": {"name": "p"}}}'),
]


class TestEdge:
    @pytest.mark.parametrize("path", ["/filter", "/preempt"])
    @pytest.mark.parametrize(("kind", "body"), HOSTILE_BODIES, ids=[k for k, _ in HOSTILE_BODIES])
    def test_malformed_input_is_a_422_that_appends_nothing(
        self, w: World, client: TestClient, path: str, kind: str, body: bytes
    ) -> None:
        """Never a 500: the detail locates the fault and does not echo the input back."""
        head = log_head(w)

        response = client.post(path, content=body, headers={"content-type": "application/json"})

        assert response.status_code == 422, (kind, response.text)
        [detail] = response.json()["detail"]
        assert detail["loc"][0] == "body" and detail["msg"] and detail["type"]
        assert "\\ud800" not in response.text and len(response.content) < 1000
        assert log_head(w) == head

    def test_the_field_at_fault_is_named(self, client: TestClient) -> None:
        body = {"Pod": {"metadata": {"name": "p", "uid": 5}}, "NodeNames": []}

        [detail] = client.post("/filter", json=body).json()["detail"]

        assert detail == {
            "loc": ["body", "Pod", "metadata", "uid"],
            "msg": "expected text, got int",
            "type": "value_error",
        }

    def test_a_body_over_the_limit_is_a_413(self, w: World) -> None:
        client = TestClient(create_extender_app(w.service, max_body_bytes=100))
        body = {"Pod": pod_json("p", "u1"), "NodeNames": ["n1", "n2"]}

        assert client.post("/filter", json=body).status_code == 413

    def test_tokens_guard_the_calls_but_not_the_probes(self, w: World) -> None:
        client = TestClient(create_extender_app(w.service, tokens=[TOKEN]))
        body = {"Pod": pod_json("p", "u1"), "NodeNames": ["n1", "n2"]}

        refused = client.post("/filter", json=body)
        wrong = client.post("/filter", json=body, headers={"Authorization": "Bearer " + "x" * 32})
        allowed = client.post("/filter", json=body, headers={"Authorization": f"Bearer {TOKEN}"})

        assert (refused.status_code, wrong.status_code, allowed.status_code) == (401, 401, 200)
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert client.get("/healthz").status_code == 200

    def test_an_unreachable_log_is_a_503_with_retry_after(
        self, w: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The first call about a testbed reads its stream; the log refusing it is a 503."""
        client = TestClient(create_extender_app(w.service))

        def down(*args: object, **kwargs: object) -> object:
            raise StoreUnavailable("connection refused")

        monkeypatch.setattr(w.store, "read_stream", down)
        response = client.post(
            "/filter", json={"Pod": pod_json("p", "u1"), "NodeNames": ["n1", "n2"]}
        )

        assert response.status_code == 503
        assert response.headers["Retry-After"] == "5"
        assert "event log is unreachable" in response.json()["detail"]

    def test_unknown_routes_and_methods(self, client: TestClient) -> None:
        assert client.get("/nope").status_code == 404
        wrong = client.get("/filter")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"

    def test_probes(self, client: TestClient) -> None:
        """Liveness, and readiness while the log answers."""
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["status"] == "ready"


class TestTokens:
    def test_flags_come_before_the_environment(self) -> None:
        tokens = extender_tokens([TOKEN], {"FLEETLEDGER_EXTENDER_TOKENS": "y" * 32})
        assert tokens is not None and tokens.accepts(TOKEN) and not tokens.accepts("y" * 32)

    def test_the_environment_is_read_comma_separated(self) -> None:
        tokens = extender_tokens(None, {"FLEETLEDGER_EXTENDER_TOKENS": f" {TOKEN} ,{'z' * 20}"})
        assert tokens is not None and len(tokens) == 2

    def test_no_tokens_is_none(self) -> None:
        assert extender_tokens(None, {}) is None

    def test_a_short_token_is_refused_naming_its_source(self) -> None:
        with pytest.raises(ValueError, match="FLEETLEDGER_EXTENDER_TOKENS: extender token 1"):
            extender_tokens(None, {"FLEETLEDGER_EXTENDER_TOKENS": "short"})

    def test_an_open_extender_beyond_loopback_is_refused(self) -> None:
        with pytest.raises(ValueError, match="kube-scheduler sends no bearer token"):
            check_extender_exposure("0.0.0.0", None, allow_open=False)
        check_extender_exposure("0.0.0.0", None, allow_open=True)
        check_extender_exposure("0.0.0.0", ApiTokens([TOKEN]), allow_open=False)
        check_extender_exposure("127.0.0.1", None, allow_open=False)


class CountingReads:
    """Counts the reads of one stream through a store."""

    def __init__(self, store: EventStore, stream_id: str) -> None:
        self.count = 0
        self._read: Callable[..., Any] = store.read_stream
        self._stream_id = stream_id

    def __call__(self, stream_id: str, **kwargs: Any) -> Any:
        if stream_id == self._stream_id:
            self.count += 1
        return self._read(stream_id, **kwargs)


class TestReadingTheLog:
    POD = PodToPlace("p", "u1", (1,))

    def test_repeated_questions_skip_the_log_while_nothing_is_appended(
        self, postgres_store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On Postgres, once the listener runs, a pod asked about again is answered from the
        fold when no other process appended since (its own reservation was folded as it
        committed)."""
        w = world(postgres_store)
        w.runtime.reconciler.reconcile(BED)
        # Only the wake-ups may send it to the log, not the age of its fold on a slow machine.
        decider = ExtenderDecider(w.service, max_fold_age=600)
        decider.prime()
        decider.filter(BED, self.POD, ("n1", "n2"))  # reads, reserves
        reads = CountingReads(postgres_store, "testbed-bed")
        monkeypatch.setattr(postgres_store, "read_stream", reads)

        answers = [decider.filter(BED, self.POD, ("n1", "n2")).nodes for _ in range(3)]

        assert answers == [("n2",)] * 3
        assert reads.count == 0

    def test_on_sqlite_every_question_reads_the_log(
        self, sqlite_store: EventStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SQLite tells no other process of an append: the stream's tail is read each time."""
        w = world(sqlite_store)
        w.runtime.reconciler.reconcile(BED)
        decider = ExtenderDecider(w.service)
        decider.prime()
        decider.filter(BED, self.POD, ("n1", "n2"))
        reads = CountingReads(sqlite_store, "testbed-bed")
        monkeypatch.setattr(sqlite_store, "read_stream", reads)

        for _ in range(3):
            decider.filter(BED, self.POD, ("n1", "n2"))

        assert reads.count == 3

    def test_another_processs_append_is_seen(self, postgres_url: str) -> None:
        """A reservation cleared and given to another pod by another process: the next
        question about the first pod is not answered from the old fold."""
        with open_store(postgres_url) as ours, open_store(postgres_url) as theirs:
            w = world(theirs)
            w.runtime.reconciler.reconcile(BED)
            # Only the other process's notification can make it read the log in time.
            decider = ExtenderDecider(TestbedsService(ours, clock=w.clock), max_fold_age=600)
            decider.prime()
            assert decider.filter(BED, self.POD, ("n1", "n2")).nodes == ("n2",)
            decider.filter(BED, self.POD, ("n1", "n2"))
            # The other process's leader sees the pod gone, then another pod takes its slot.
            w.clock.advance(1)
            w.runtime.step()
            other = ExtenderDecider(w.service)
            assert other.filter(BED, PodToPlace("q", "u2", (1,)), ("n1", "n2")).nodes == ("n2",)

            answers = []

            def moved_on() -> bool:
                answers.append(decider.filter(BED, self.POD, ("n1", "n2")))
                return not answers[-1].nodes

            wait_until(moved_on, timeout=5, what="the other process's append to be seen")
            assert "no free slot for pod p" in answers[-1].failed["n2"]

    def test_calls_on_a_loop_see_another_processs_append(self, postgres_url: str) -> None:
        """The same on an event loop, where a pod asking again is answered without running the
        decision's steps: a notification still sends the next call to the log."""
        with open_store(postgres_url) as ours, open_store(postgres_url) as theirs:
            w = world(theirs)
            w.runtime.reconciler.reconcile(BED)
            decider = ExtenderDecider(TestbedsService(ours, clock=w.clock), max_fold_age=600)
            decider.prime()
            ask = functools.partial(decider.afilter, BED, self.POD, ("n1", "n2"))
            assert asyncio.run(ask()).nodes == ("n2",)
            assert asyncio.run(ask()).nodes == ("n2",)  # from the fold
            w.clock.advance(1)
            w.runtime.step()
            other = ExtenderDecider(w.service)
            assert other.filter(BED, PodToPlace("q", "u2", (1,)), ("n1", "n2")).nodes == ("n2",)

            answers = []

            def moved_on() -> bool:
                answers.append(asyncio.run(ask()))
                return not answers[-1].nodes

            wait_until(moved_on, timeout=5, what="the other process's append to be seen")
            assert "no free slot for pod p" in answers[-1].failed["n2"]


class TestHeldReservations:
    @pytest.mark.parametrize("candidates", [("n1", "n2"), ("n2",), ("n1",), ()])
    def test_a_held_reservation_is_answered_as_the_domain_answers(
        self, w: World, candidates: tuple[str, ...]
    ) -> None:
        """The answer from the reservations' index is filter_pod's, whatever the candidates."""
        decider = ExtenderDecider(w.service)
        for name, slot_ids in (("a", (1,)), ("b", (1, 3)), ("c", (0,))):
            decider.filter(BED, PodToPlace(name, f"u-{name}", slot_ids), ("n1", "n2"))
        state = w.service.testbed(BED).state

        for name, slot_ids in (("a", (1,)), ("b", (1, 3)), ("c", (0,))):
            pod = PodToPlace(name, f"u-{name}", slot_ids)
            assert decider.filter(BED, pod, candidates) == filter_pod(
                state, pod, candidates, at=w.clock.now()
            )


class TestConcurrentCalls:
    def test_calls_in_flight_share_their_reads_of_the_log(
        self, w: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Twenty calls at once, each needing the stream's tail, are all answered (within a
        deadline) with far fewer reads than calls."""
        decider = ExtenderDecider(w.service)
        pods = [PodToPlace(f"p{i}", f"u{i}", (i % 4,)) for i in range(20)]
        reads = CountingReads(w.store, "testbed-bed")
        monkeypatch.setattr(w.store, "read_stream", reads)

        async def all_at_once() -> list[tuple[str, ...]]:
            answers = [decider.afilter(BED, pod, ("n1", "n2")) for pod in pods]
            decisions = await asyncio.wait_for(asyncio.gather(*answers), timeout=60)
            return [d.nodes for d in decisions]

        nodes = asyncio.run(all_at_once())

        assert sorted(n for n in nodes if n) == [("n1",), ("n1",), ("n2",), ("n2",)]
        assert reads.count < len(pods)


class TestRacingExtenders:
    def test_a_pod_is_answered_with_the_slot_the_log_took(
        self, w: World, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An extender deciding on a fold that missed another process's reservation of the
        slot answers with the slot its append got once decided again, not the one it chose."""
        ours = ExtenderDecider(TestbedsService(w.store, clock=w.clock))
        ours.filter(BED, PodToPlace("warm", "u0", (0,)), ("n1", "n2"))  # folds the testbed
        theirs = ExtenderDecider(TestbedsService(w.store, clock=w.clock))
        assert theirs.filter(BED, PodToPlace("q", "uq", (1,)), ("n1", "n2")).nodes == ("n2",)
        # Their notification has not arrived: our fold still shows slot 1 free.
        monkeypatch.setattr(ours, "_stale", lambda bed: False)

        answer = ours.filter(BED, PodToPlace("p", "up", (1, 2)), ("n1", "n2"))

        assert answer.nodes == ("n1",)
        other = TestbedsService(w.store, clock=w.clock)
        reserved = testbed.reservation_of(other.testbed(BED).state, "p")
        assert reserved is not None and reserved.slot_id == 2


class TestEdgeRule:
    @pytest.mark.parametrize(
        ("change", "loc"),
        [
            ({"name": "p\x00"}, ["body", "Pod", "metadata", "name"]),
            ({"name": "p\x1b[2J"}, ["body", "Pod", "metadata", "name"]),
            ({"uid": "u\x00"}, ["body", "Pod", "metadata", "uid"]),
            ({"uid": "u\x1b"}, ["body", "Pod", "metadata", "uid"]),
            ({"name": "x" * 254}, ["body", "Pod", "metadata", "name"]),
        ],
    )
    def test_a_pod_name_or_uid_the_log_must_not_hold_is_422(
        self, w: World, client: TestClient, change: dict[str, str], loc: list[str]
    ) -> None:
        """NUL, ESC or an oversized name never reach a reservation event."""
        pod = pod_json("p", "u1")
        pod["metadata"].update(change)
        head = log_head(w)

        response = client.post("/filter", json={"Pod": pod, "NodeNames": ["n1", "n2"]})

        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == loc
        assert log_head(w) == head

    def test_a_node_name_with_a_control_character_is_422(
        self, w: World, client: TestClient
    ) -> None:
        head = log_head(w)
        response = client.post("/filter", json={"Pod": pod_json("p", "u1"), "NodeNames": ["n\x00"]})
        assert response.status_code == 422
        assert response.json()["detail"][0]["loc"] == ["body", "NodeNames", 0]
        assert log_head(w) == head

    @pytest.mark.parametrize(
        "node",
        [
            b'{"metadata": {"name": "n1"}, "status": {"x": NaN}}',
            b'{"metadata": {"name": "n1"}, "status": {"x": Infinity}}',
            b'{"metadata": {"name": "n1"}, "status": {"x": "\\ud800"}}',
            b'{"metadata": {"name": "n1"}, "s": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        ],
    )
    def test_what_a_node_object_cannot_carry_back_is_422(
        self, w: World, client: TestClient, node: bytes
    ) -> None:
        """Node objects are passed back as they came: whatever JSON could not carry back is
        refused up front (it once made the answer a 500)."""
        pod = json.dumps(pod_json("p", "u1")).encode()
        body = b'{"Pod": ' + pod + b', "Nodes": {"items": [' + node + b"]}}"

        response = client.post("/filter", content=body)

        assert response.status_code == 422

    def test_a_slot_id_of_thousands_of_digits_is_the_pods_error(self, client: TestClient) -> None:
        """Answered in the result's Error like any malformed slot request, not a 500."""
        answer = client.post(
            "/filter", json={"Pod": pod_json("p", "u1", "9" * 5000), "NodeNames": ["n1"]}
        )
        assert answer.status_code == 200
        assert "slot ids must be" in answer.json()["Error"]


class TestReadinessDeadline:
    def test_readiness_answers_within_a_second_while_the_log_is_locked(
        self, postgres_store: EventStore
    ) -> None:
        """With the events table locked (a hung database), /readyz is a 503 saying so, in time."""
        w = world(postgres_store)
        client = TestClient(create_extender_app(w.service))
        with postgres_store.engine.connect() as locker:
            locker.exec_driver_sql("BEGIN")
            locker.exec_driver_sql("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            response = client.get("/readyz")
            elapsed = time.monotonic() - started
            locker.exec_driver_sql("ROLLBACK")

        assert response.status_code == 503
        assert "did not finish within" in response.json()["detail"]
        assert elapsed < 1.0


class TestExposure:
    def test_beyond_loopback_tls_alone_is_allowed(self) -> None:
        check_extender_exposure("0.0.0.0", None, allow_open=False, tls=True)

    def test_beyond_loopback_neither_tokens_nor_tls_is_refused(self) -> None:
        with pytest.raises(ValueError, match="neither extender tokens nor TLS"):
            check_extender_exposure("0.0.0.0", None, allow_open=False, tls=False)
