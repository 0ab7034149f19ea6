"""Hostile bodies, ids and queries at every route of every listener of a running ``serve``, on
Postgres: never a ``5xx``, never an event appended, and the listeners answer afterwards."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetledger.adapters.benchmarks.edge_fuzz import (
    HOSTILE_PATH_SEGMENTS,
    Route,
    Served,
    appended_since,
    extender_route_list,
    fuzz_served,
    hostile_values,
    idle_connections_closed_at,
    quiet_head,
    routes_of,
    serving,
)
from fleetledger.adapters.extender.server import extender_routes
from fleetledger.eventstore import open_store


@pytest.fixture(scope="module")
def served(eventstore_postgres_server: str) -> Iterator[Served]:
    with serving(eventstore_postgres_server) as running:
        quiet_head(running.database)  # start-up appends (election, subnets) are over
        yield running


@pytest.fixture(scope="module")
def routes(served: Served) -> list[Route]:
    openapi = httpx.get(f"{served.api}/openapi.json").json()
    return routes_of(openapi) + extender_route_list()


def head(served: Served) -> int:
    with contextlib.closing(open_store(served.database)) as store:
        return store.head()


def _text(value: str) -> bytes:
    # ensure_ascii: lone surrogates and control characters travel as escapes, as a client's would.
    return json.dumps(value, ensure_ascii=True).encode()


# What no field may take, drawn rather than listed: non-finite and huge numbers, integers past
# 2^53, text holding a control character or a lone surrogate, text past every limit, nesting.
_hostile_numbers = st.one_of(
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e400"]),
    st.floats(min_value=1e301, max_value=1e308).map(lambda f: repr(f).encode()),
    st.integers(min_value=2**53, max_value=2**80).map(lambda i: str(i).encode()),
)
_bad_characters = st.characters(codec=None, categories=["Cc", "Cs"])
_hostile_text = st.builds(
    lambda before, bad, after: _text(before + bad + after),
    st.text(max_size=5),
    _bad_characters,
    st.text(max_size=5),
)
_hostile_nesting = st.integers(min_value=100, max_value=20_000).map(
    lambda depth: b"[" * depth + b"]" * depth
)
_hostile_fragment = st.one_of(
    _hostile_numbers,
    _hostile_text,
    _hostile_nesting,
    st.integers(min_value=5_000, max_value=200_000).map(lambda n: _text("x" * n)),
    st.sampled_from(hostile_values(id_like=False)),
)


def _fields(value: Any, loc: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            found += [(*loc, key), *_fields(item, (*loc, key))]
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += [(*loc, index), *_fields(item, (*loc, index))]
    return found


def _with(body: Any, loc: tuple[Any, ...], fragment: bytes) -> bytes:
    mark = "\u2063hostile\u2063"
    copy = json.loads(json.dumps(body))
    target = copy
    for part in loc[:-1]:
        target = target[part]
    target[loc[-1]] = mark
    return json.dumps(copy).encode().replace(json.dumps(mark).encode(), fragment, 1)


def _call(served: Served, route: Route, url: str, body: bytes) -> int:
    base = served.extender if route.listener == "extender" else served.api
    headers = {"content-type": "application/json"} if body else {}
    try:
        return httpx.request(route.method, base + url, content=body, headers=headers).status_code
    except httpx.HTTPError:
        return 0  # closed or reset: refused, not answered with an error


class TestEveryRoute:
    def test_the_route_list_is_the_apps(self, routes: list[Route]) -> None:
        """Every listener's routes are fuzzed, read from the apps themselves."""
        listeners = {route.listener for route in routes}
        assert listeners == {"api", "agents", "extender"}
        assert {r.path for r in routes if r.listener == "extender"} == set(extender_routes())
        assert {"/v1/workloads", "/v1/machines", "/v1/agent/resources"} <= {r.path for r in routes}

    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def test_hostile_fields_are_refused_and_append_nothing(
        self, served: Served, routes: list[Route], data: st.DataObject
    ) -> None:
        """A valid body with one field made hostile is a 4xx and appends nothing."""
        with_bodies = [r for r in routes if r.body is not None and _fields(r.body)]
        route = data.draw(st.sampled_from(with_bodies), label="route")
        loc = data.draw(st.sampled_from(_fields(route.body)), label="field")
        fragment = data.draw(_hostile_fragment, label="value")
        before = head(served)

        status = _call(served, route, route.url(), _with(route.body, loc, fragment))

        assert status < 500, f"{route.method} {route.path} {loc}: {status}"
        assert appended_since(served.database, before) == 0

    @settings(
        max_examples=60,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(data=st.data())
    def test_hostile_ids_in_paths_are_refused(
        self, served: Served, routes: list[Route], data: st.DataObject
    ) -> None:
        """An id holding /, ?, a control character or a lone surrogate is refused (never a
        5xx) and appends nothing."""
        with_ids = [r for r in routes if r.parameters]
        route = data.draw(st.sampled_from(with_ids), label="route")
        segment = data.draw(
            st.one_of(
                st.sampled_from(HOSTILE_PATH_SEGMENTS),
                st.text(_bad_characters, min_size=1, max_size=3).map(
                    lambda t: "a" + "".join(f"%{b:02X}" for b in t.encode("utf-8", "surrogatepass"))
                ),
            ),
            label="id",
        )
        body = b"" if route.body is None else json.dumps(route.body).encode()
        before = head(served)

        status = _call(served, route, route.url(dict.fromkeys(route.parameters, segment)), body)

        assert status < 500, f"{route.method} {route.path} {segment!r}: {status}"
        assert appended_since(served.database, before) == 0

    def test_the_bench_finds_no_errors_and_the_listeners_still_serve(self, served: Served) -> None:
        """The bench's sweep over every route: no 5xx, nothing appended, still ready."""
        report = fuzz_served(served, inputs_per_route=25, rng=random.Random(7))

        assert report["server_errors"] == 0, report["failures"]
        assert report["appended"] == 0
        assert report["serves_afterwards"]
        assert min(report["hostile_inputs"].values()) > 0

    def test_idle_connections_to_serve_are_closed(self, served: Served) -> None:
        """Silent sockets and idle keep-alive ones are closed past the idle timeout."""
        report = idle_connections_closed_at("127.0.0.1", served.api_port, connections=100, wait=10)

        assert report == {"idle_connections": 100, "idle_connections_closed": 100}
