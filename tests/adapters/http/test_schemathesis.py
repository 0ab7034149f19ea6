"""The schema and the behaviour agree: schemathesis over every route, with and without a token.

A bounded run (a few dozen cases per operation, positive and negative) asserting no 5xx, the
response conformance checks, and that a refused request appends nothing. "Nothing" is counted in
requests recorded: batches of accepted requests keep completing in the background meanwhile.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import schemathesis
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
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.domain.machines import GrouperConfig
from fleetledger.eventstore import EventStore, open_store
from tests.adapters.http.schema_checks import REFUSALS

TOKEN = "schemathesis-token-0123456789"
# Batches fall due only at shutdown (skip-batching requests still seal at once).
SLOW = GrouperConfig(
    idle_timeout=timedelta(minutes=5), max_timeout=timedelta(minutes=10), max_batch_size=50
)
CHECKS: list[Any] = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
PROBES = ("/healthz", "/readyz")
AUTHORIZED = {"Authorization": f"Bearer {TOKEN}"}


@contextlib.contextmanager
def served_schema(url: str) -> Iterator[tuple[Any, EventStore]]:
    with contextlib.closing(open_store(url)) as store:
        runtime = MachinesRuntime(store, FakeCloud(), clock=SystemClock(), config=SLOW)
        runtime.start()
        try:
            app = create_app(runtime, api_tokens=[TOKEN])
            schema = schemathesis.openapi.from_asgi(
                "/openapi.json", app, headers=AUTHORIZED, config=REFUSALS
            )
            yield schema, store
        finally:
            runtime.stop()


@pytest.fixture
def served(sqlite_url: str) -> Iterator[tuple[Any, EventStore]]:
    with served_schema(sqlite_url) as pair:
        yield pair


def operations(schema: Any) -> list[Any]:
    found = [result.ok() for result in schema.get_all_operations()]
    assert {operation.path for operation in found} >= {"/v1/machines", *PROBES}
    return found


def requests_recorded(store: EventStore) -> int:
    return sum(1 for event in store.read_all(after=0) if event.type == "vm.MachineRequested")


def _short_wait(case: Case[Any]) -> None:
    # A long poll on a request generated a moment ago would hold the run for up to a minute.
    if case.query and isinstance(case.query.get("wait"), int | float):
        case.query["wait"] = min(case.query["wait"], 0.05)


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
        _short_wait(case)
        test(case)

    run()


class TestSchemaAgreesWithBehaviour:
    @pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    def test_with_a_token_no_5xx_and_refusals_append_nothing(
        self, served: tuple[Any, EventStore], mode: GenerationMode
    ) -> None:
        """Every call conforms to the schema (statuses, headers, bodies; schema-violating
        input refused), no call is a 5xx, and a refused call leaves the log as it was."""
        schema, store = served

        def check(case: Case[Any]) -> None:
            before = requests_recorded(store)
            response = case.call_and_validate(headers=AUTHORIZED, checks=CHECKS)
            if response.status_code >= 400:
                assert requests_recorded(store) == before, f"{response.status_code}, recorded"

        for operation in operations(schema):
            # The probes take no input, so there is nothing to make invalid.
            if mode is GenerationMode.POSITIVE or operation.path not in PROBES:
                run_cases(operation, mode, 25, check)

    def test_without_a_token_only_the_probes_answer(self, served: tuple[Any, EventStore]) -> None:
        """Without a token every call but the probes is 401 with a challenge; nothing is
        appended."""
        schema, store = served

        def check(case: Case[Any]) -> None:
            before = requests_recorded(store)
            response = case.call()
            assert response.status_code < 500
            if case.path not in PROBES:
                assert response.status_code == 401
                assert response.headers["www-authenticate"][0].startswith("Bearer")
            assert requests_recorded(store) == before

        for operation in operations(schema):
            run_cases(operation, GenerationMode.POSITIVE, 10, check)
