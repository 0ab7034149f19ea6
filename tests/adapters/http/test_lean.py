"""LeanRoute and LeanApp: a JSON body validated straight from bytes, answered as FastAPI would."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Receive, Scope, Send

from fleetledger.adapters.http.auth import ApiTokens, BearerAuth
from fleetledger.adapters.http.lean import LeanApp, LeanRoute, LeanRouter
from fleetledger.adapters.http.limits import BodySizeLimit


class Order(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item: str = Field(min_length=1)
    count: int = Field(ge=1)


def app_with(endpoint: object) -> TestClient:
    router = APIRouter()
    router.add_api_route("/orders", endpoint, methods=["POST"], route_class_override=LeanRoute)  # type: ignore[arg-type]
    app = FastAPI()
    app.include_router(router)
    return TestClient(app)


async def take(order: Order) -> JSONResponse:
    return JSONResponse({"item": order.item, "count": order.count}, status_code=201)


def test_a_valid_body_reaches_the_endpoint_as_its_model() -> None:
    client = app_with(take)

    response = client.post("/orders", json={"item": "disk", "count": 2})

    assert response.status_code == 201
    assert response.json() == {"item": "disk", "count": 2}


def test_an_invalid_body_is_a_422_naming_the_field_under_body() -> None:
    client = app_with(take)

    response = client.post("/orders", json={"item": "disk", "count": 0})

    assert response.status_code == 422
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "count"]


def test_malformed_json_is_a_422() -> None:
    client = app_with(take)

    response = client.post(
        "/orders", content=b'{"item": ', headers={"content-type": "application/json"}
    )

    assert response.status_code == 422
    assert response.json()["detail"][0]["type"] == "json_invalid"


def test_a_body_not_declared_as_json_is_answered_as_fastapi_would() -> None:
    """Text/plain and empty bodies take FastAPI's own handler: the same 422s as any route."""
    client = app_with(take)

    as_text = client.post("/orders", content=b"{}", headers={"content-type": "text/plain"})
    empty = client.post("/orders", content=b"", headers={"content-type": "application/json"})

    assert as_text.status_code == 422
    assert empty.status_code == 422
    assert empty.json()["detail"][0]["type"] == "missing"


def test_the_schema_documents_the_body_model() -> None:
    client = app_with(take)

    operation = client.get("/openapi.json").json()["paths"]["/orders"]["post"]

    schema = operation["requestBody"]["content"]["application/json"]["schema"]
    assert schema == {"$ref": "#/components/schemas/Order"}


def test_an_endpoint_with_other_parameters_is_refused_when_routed() -> None:
    async def paged(order: Order, page: int = Query(1)) -> JSONResponse:
        return JSONResponse({})

    with pytest.raises(TypeError, match="exactly one parameter"):
        app_with(paged)


def test_a_plain_function_endpoint_is_refused_when_routed() -> None:
    def blocking(order: Order) -> JSONResponse:
        return JSONResponse({})

    with pytest.raises(TypeError, match="must be async"):
        app_with(blocking)


# -- LeanApp: lean routes served ahead of the framework ------------------------------------------


class Refused(Exception):
    pass


def lean_app(endpoint: object, **options: object) -> LeanApp:
    router = LeanRouter()
    router.add_lean_post("/orders", endpoint)  # type: ignore[arg-type]
    app = LeanApp(**options)
    app.include_router(router)
    return app


def framework_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths of the requests that went through FastAPI's own stack."""
    calls: list[str] = []
    through = FastAPI.__call__

    async def counted(self: FastAPI, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            calls.append(scope["path"])
        await through(self, scope, receive, send)

    monkeypatch.setattr(FastAPI, "__call__", counted)
    return calls


class TestLeanApp:
    def test_a_valid_body_is_answered_without_the_framework(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls = framework_calls(monkeypatch)
        with TestClient(lean_app(take)) as client:
            response = client.post("/orders", json={"item": "disk", "count": 2})

        assert response.status_code == 201
        assert response.json() == {"item": "disk", "count": 2}
        assert calls == []

    def test_an_invalid_body_is_answered_by_the_framework_as_any_route(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        calls = framework_calls(monkeypatch)
        with TestClient(lean_app(take)) as client:
            invalid = client.post("/orders", json={"item": "disk", "count": 0})
            as_text = client.post("/orders", content=b"{}", headers={"content-type": "text/plain"})

        assert invalid.status_code == 422
        assert invalid.json()["detail"][0]["loc"] == ["body", "count"]
        assert as_text.status_code == 422
        assert calls == ["/orders", "/orders"]

    def test_the_apps_own_middleware_still_runs(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The token check and the body limit wrap the lane as they wrap the app: they answer
        without the framework's stack being entered."""
        calls = framework_calls(monkeypatch)
        app = lean_app(take)
        app.add_middleware(BodySizeLimit, max_bytes=64)
        app.add_middleware(BearerAuth, tokens=ApiTokens(["a-token-of-sixteen-chars"]))
        with TestClient(app) as client:
            anonymous = client.post("/orders", json={"item": "disk", "count": 2})
            too_big = client.post(
                "/orders",
                json={"item": "d" * 100, "count": 2},
                headers={"Authorization": "Bearer a-token-of-sixteen-chars"},
            )
            allowed = client.post(
                "/orders",
                json={"item": "disk", "count": 2},
                headers={"Authorization": "Bearer a-token-of-sixteen-chars"},
            )

        assert anonymous.status_code == 401
        assert too_big.status_code == 413
        assert allowed.status_code == 201
        assert calls == []

    def test_an_endpoints_exception_is_answered_by_the_apps_handler(self) -> None:
        async def refuse(order: Order) -> JSONResponse:
            raise Refused(order.item)

        app = lean_app(refuse)

        async def refused(request: Request, error: Exception) -> JSONResponse:
            return JSONResponse({"detail": f"refused {error}"}, status_code=409)

        app.add_exception_handler(Refused, refused)
        with TestClient(app) as client:
            response = client.post("/orders", json={"item": "disk", "count": 2})

        assert response.status_code == 409
        assert response.json() == {"detail": "refused disk"}

    def test_app_wide_dependencies_keep_the_route_in_the_framework(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A lane cannot run the app's dependencies: with any, the route is routed as usual."""
        seen: list[str] = []

        def audit(request: Request) -> None:
            seen.append(request.url.path)

        calls = framework_calls(monkeypatch)
        with TestClient(lean_app(take, dependencies=[Depends(audit)])) as client:
            response = client.post("/orders", json={"item": "disk", "count": 2})

        assert response.status_code == 201
        assert seen == ["/orders"]
        assert calls == ["/orders"]

    def test_a_lean_router_included_with_dependencies_is_refused(self) -> None:
        router = LeanRouter()
        router.add_lean_post("/orders", take)

        with pytest.raises(TypeError, match="solve no dependencies"):
            LeanApp().include_router(router, dependencies=[Depends(lambda: None)])
