"""LeanRoute: a JSON body validated straight from bytes, answered as FastAPI would."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, FastAPI, Query
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient
from pydantic import BaseModel, ConfigDict, Field

from fleetledger.adapters.http.lean import LeanRoute


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
