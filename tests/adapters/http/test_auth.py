"""Bearer tokens: every route but the probes needs one; 401 with a challenge; never logged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import structlog
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from starlette.testclient import WebSocketDenialResponse
from starlette.types import Message, Receive, Scope, Send

from fleetledger.adapters.clock import SystemClock
from fleetledger.adapters.cloud import FakeCloud
from fleetledger.adapters.http import ApiTokens, create_app
from fleetledger.adapters.http.auth import (
    ENV_VARIABLE,
    MIN_TOKEN_LENGTH,
    PUBLIC_PATHS,
    BearerAuth,
    check_exposure,
)
from fleetledger.adapters.machines import MachinesRuntime
from fleetledger.eventstore import EventStore, open_store

OLD = "old-token-0123456789abcdef"
NEW = "new-token-fedcba9876543210"
MACHINE = {"machine_name": "m-1", "template": {"vm_size": "Standard_D4s_v5"}}


@contextlib.contextmanager
def serving(url: str, tokens: list[str]) -> Iterator[tuple[TestClient, EventStore]]:
    with contextlib.closing(open_store(url)) as store:
        runtime = MachinesRuntime(store, FakeCloud(), clock=SystemClock())
        app = create_app(runtime, manage_runtime=True, api_tokens=tokens)
        with TestClient(app) as client:
            yield client, store


@pytest.fixture
def api(sqlite_url: str) -> Iterator[tuple[TestClient, EventStore]]:
    with serving(sqlite_url, [OLD, NEW]) as served:
        yield served


@pytest.fixture
def client(api: tuple[TestClient, EventStore]) -> TestClient:
    return api[0]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class TestApiTokens:
    def test_parse_takes_comma_separated_tokens(self) -> None:
        """The environment variable's form: commas, spaces around them, blanks ignored."""
        tokens = ApiTokens.parse(f" {OLD} ,, {NEW},")

        assert len(tokens) == 2
        assert tokens.accepts(OLD) and tokens.accepts(NEW)

    def test_from_env_reads_the_variable(self) -> None:
        """Set: the tokens; unset or blank: ``None``."""
        assert ApiTokens.from_env({ENV_VARIABLE: OLD}) is not None
        assert ApiTokens.from_env({ENV_VARIABLE: " "}) is None
        assert ApiTokens.from_env({}) is None

    @pytest.mark.parametrize(
        ("tokens", "advice"),
        [
            ([], "FLEETLEDGER_API_TOKENS"),
            (["short"], f"at least {MIN_TOKEN_LENGTH}"),
            ([OLD + " x"], "only letters"),
            ([OLD + "\x00"], "only letters"),
        ],
        ids=["none", "too short", "space", "NUL"],
    )
    def test_bad_tokens_are_refused_saying_how_to_fix_them(
        self, tokens: list[str], advice: str
    ) -> None:
        """Configuration is checked once, with a message that says what to do."""
        with pytest.raises(ValueError, match=advice):
            ApiTokens(tokens)

    def test_the_repr_shows_no_token(self) -> None:
        """A token printed by accident (a log line, a traceback) gives nothing away."""
        tokens = ApiTokens([OLD])

        assert OLD not in repr(tokens)
        assert repr(tokens) == "ApiTokens(<1 token(s)>)"

    @given(st.text(max_size=40))
    def test_only_configured_tokens_are_accepted(self, candidate: str) -> None:
        """Anything else — prefixes, extensions, other text — is refused."""
        tokens = ApiTokens([OLD, NEW])

        assert tokens.accepts(candidate) == (candidate in (OLD, NEW))


class TestMiddleware:
    def test_no_token_is_401_with_a_challenge(self, api: tuple[TestClient, EventStore]) -> None:
        """A request without a token is refused before anything is appended."""
        client, store = api

        response = client.post("/v1/machines", json=MACHINE)

        assert response.status_code == 401
        assert response.headers["www-authenticate"] == 'Bearer realm="fleetledger"'
        assert store.head() == 0

    def test_a_wrong_token_is_401_invalid_token(self, client: TestClient) -> None:
        """The challenge says the token was not valid (RFC 6750)."""
        response = client.get("/v1/machines/r-1", headers=bearer(OLD[:-1] + "X"))

        assert response.status_code == 401
        assert 'error="invalid_token"' in response.headers["www-authenticate"]

    @pytest.mark.parametrize("token", [OLD, NEW])
    def test_every_configured_token_gets_in(self, client: TestClient, token: str) -> None:
        """Two tokens at once: the rotation window."""
        response = client.post("/v1/machines", json=MACHINE, headers=bearer(token))

        assert response.status_code == 202

    def test_the_scheme_is_case_insensitive(self, client: TestClient) -> None:
        """``bearer`` is the same scheme as ``Bearer`` (RFC 7235)."""
        response = client.get("/v1/machines/r-1", headers={"Authorization": f"bearer {OLD}"})

        assert response.status_code == 404

    def test_basic_credentials_are_not_a_token(self, client: TestClient) -> None:
        """Another scheme carrying the token's text does not get in."""
        response = client.get("/v1/machines/r-1", headers={"Authorization": f"Basic {OLD}"})

        assert response.status_code == 401

    @pytest.mark.parametrize("path", ["/healthz", "/readyz"])
    def test_the_probes_need_no_token(self, client: TestClient, path: str) -> None:
        """Orchestrators probe without credentials."""
        assert client.get(path).status_code == 200

    def test_the_schema_needs_a_token(self, client: TestClient) -> None:
        """The OpenAPI document is a route like any other."""
        assert client.get("/openapi.json").status_code == 401
        assert client.get("/openapi.json", headers=bearer(OLD)).status_code == 200

    def test_an_unauthenticated_body_is_not_parsed(self, client: TestClient) -> None:
        """Garbage from a caller without a token gets 401, not a parse error."""
        response = client.post(
            "/v1/machines", content=b"{not json", headers={"Content-Type": "application/json"}
        )

        assert response.status_code == 401

    def test_tokens_are_never_logged(self, client: TestClient) -> None:
        """Neither a refused nor an accepted token appears in any log line."""
        with structlog.testing.capture_logs() as logs:
            client.get("/v1/machines/r-1", headers=bearer(NEW + "-wrong"))
            client.post("/v1/machines", json=MACHINE, headers=bearer(OLD))

        assert logs, "the refusal is logged"
        assert not any(NEW in repr(entry) or OLD in repr(entry) for entry in logs)


def handshake(
    path: str, headers: list[tuple[bytes, bytes]], *, denial: bool
) -> tuple[list[Message], bool]:
    """A websocket handshake through the middleware alone: what it sent, and whether the app
    behind it was called. ``denial``: the server can answer a handshake with HTTP."""
    sent: list[Message] = []
    reached: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(True)

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "websocket",
        "path": path,
        "headers": headers,
        "extensions": {"websocket.http.response": {}} if denial else {},
    }
    asyncio.run(BearerAuth(app, tokens=ApiTokens([OLD]))(scope, receive, send))
    return sent, bool(reached)


class TestWebsockets:
    def test_a_handshake_without_a_token_is_401_before_it_is_accepted(
        self, client: TestClient
    ) -> None:
        """The same answer as for HTTP, sent instead of the handshake's acceptance."""
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/watch"),
        ):
            pass

        assert refused.value.status_code == 401
        assert refused.value.headers["www-authenticate"] == 'Bearer realm="fleetledger"'

    def test_a_wrong_token_is_401_invalid_token(self, client: TestClient) -> None:
        with (
            pytest.raises(WebSocketDenialResponse) as refused,
            client.websocket_connect("/v1/watch", headers=bearer("x" * 32)),
        ):
            pass

        assert refused.value.status_code == 401
        assert 'error="invalid_token"' in refused.value.headers["www-authenticate"]

    def test_a_handshake_with_a_token_reaches_the_app(self) -> None:
        sent, reached = handshake(
            "/v1/watch", [(b"authorization", f"Bearer {OLD}".encode())], denial=True
        )

        assert (sent, reached) == ([], True)

    def test_without_the_denial_extension_it_is_closed_with_1008(self) -> None:
        """A server that cannot send HTTP in a handshake gets a policy-violation close."""
        sent, reached = handshake("/v1/watch", [], denial=False)

        assert not reached
        assert [(m["type"], m["code"]) for m in sent] == [("websocket.close", 1008)]


class TestOpenApi:
    def test_the_bearer_scheme_is_documented(self, client: TestClient) -> None:
        """``components.securitySchemes`` declares HTTP bearer."""
        schema = client.get("/openapi.json", headers=bearer(OLD)).json()

        assert schema["components"]["securitySchemes"]["bearerAuth"] == {
            "type": "http",
            "scheme": "bearer",
            "description": f"One of the tokens configured on the server ({ENV_VARIABLE}).",
        }

    def test_every_operation_but_the_probes_requires_it(self, client: TestClient) -> None:
        """Each protected operation lists the scheme and its 401; the probes list neither."""
        paths = client.get("/openapi.json", headers=bearer(OLD)).json()["paths"]

        for path, operations in paths.items():
            for operation in operations.values():
                protected = path not in PUBLIC_PATHS
                assert ("security" in operation) == protected, path
                assert ("401" in operation["responses"]) == protected, path

    def test_without_tokens_nothing_is_required(self, sqlite_url: str) -> None:
        """An app built without tokens documents no scheme (and asks for none)."""
        with contextlib.closing(open_store(sqlite_url)) as store:
            app = create_app(MachinesRuntime(store, FakeCloud(), clock=SystemClock()))
            schema = app.openapi()

        assert "securitySchemes" not in schema.get("components", {})


class TestExposure:
    @pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.8.9.10"])
    def test_loopback_may_be_open(self, host: str) -> None:
        """Only this machine can reach a loopback address: no token needed."""
        check_exposure(host, None)

    @pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.7", "fleetledger.internal", ""])
    def test_anything_else_needs_tokens(self, host: str) -> None:
        """An open API beyond loopback is refused, saying how to add tokens or opt out."""
        with pytest.raises(ValueError, match="--insecure-no-auth"):
            check_exposure(host, None)

    def test_tokens_or_an_explicit_choice_allow_any_address(self) -> None:
        """With tokens, or told explicitly, any address is fine."""
        check_exposure("0.0.0.0", ApiTokens([OLD]))
        check_exposure("0.0.0.0", None, allow_open=True)
