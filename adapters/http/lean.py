"""A route class for the hot endpoints: a JSON body validated by pydantic, nothing else solved.

FastAPI's general request handler solves dependencies, parses the body with ``json.loads``,
validates the result, then validates and serialises the return value against the response model.
On the two endpoints called thousands of times a second (agents asking for permits, controllers
posting machine requests) that machinery is a large share of the server's work. Measured on the
agent endpoint with its service stubbed out, server CPU per request over HTTP: 0.34 ms with
FastAPI's handler, 0.24 ms with this class (in-process, without the HTTP server: 160-175 µs
against 100-130 µs).

:class:`LeanRoute` serves an endpoint whose only parameter is a pydantic model (the JSON body)
and which returns a :class:`~starlette.responses.Response` itself: the body is validated straight
from bytes (``model_validate_json``), and a validation error is raised as FastAPI's
:class:`~fastapi.exceptions.RequestValidationError` with ``loc`` starting at ``"body"``, so the
app's one 422 handler answers it exactly as it answers every other route. The route is still an
``APIRoute``: the OpenAPI schema documents it from the same signature. A request whose body is
empty or not declared as JSON takes FastAPI's own handler, which answers those the usual way, and
so does every request of an app with app-wide dependencies (the handler solves them).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, TypeAlias, cast, get_type_hints

from fastapi import APIRouter, FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from .limits import replay_body

__all__ = ["LeanApp", "LeanRoute", "LeanRouter", "read_body"]


class LeanRoute(APIRoute):
    """An ``APIRoute`` for ``async def endpoint(body: SomeModel) -> Response``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        general = super().get_route_handler()
        model = _body_model(self.endpoint)
        endpoint = self.endpoint

        async def handle(request: Request) -> Response:
            if request.app.router.dependencies:
                return await general(request)  # app-wide dependencies: solve them as usual
            content_type = request.headers.get("content-type", "")
            body = await request.body()
            if not body or not _is_json(content_type):
                return await general(request)
            try:
                parsed = model.model_validate_json(body)
            except ValidationError as e:
                # Without the input: a NaN or a lone surrogate sent by the client could not be
                # encoded back by whichever handler answers the 422.
                raise RequestValidationError(
                    [
                        {"type": error["type"], "loc": ("body", *error["loc"]), "msg": error["msg"]}
                        for error in e.errors(include_input=False, include_url=False)
                    ]
                ) from e
            response: Response = await endpoint(parsed)
            return response

        return handle


def _body_model(endpoint: Callable[..., Any]) -> type[BaseModel]:
    if not inspect.iscoroutinefunction(endpoint):
        raise TypeError(f"{endpoint.__qualname__}: a LeanRoute endpoint must be async")
    parameters = list(inspect.signature(endpoint).parameters)
    hints = get_type_hints(endpoint)
    model = hints.get(parameters[0]) if len(parameters) == 1 else None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(
            f"{endpoint.__qualname__}: a LeanRoute endpoint takes exactly one parameter, "
            "its body's pydantic model"
        )
    return model


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")


Endpoint: TypeAlias = Callable[[Any], Coroutine[Any, Any, Response]]


class LeanRouter(APIRouter):
    """An ``APIRouter`` that also records its lean routes, so a :class:`LeanApp` including it
    can serve them directly."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.lean_routes: dict[str, Endpoint] = {}

    def add_lean_post(self, path: str, endpoint: Endpoint, **route_options: Any) -> None:
        """``POST path`` served by ``endpoint`` on a :class:`LeanRoute` (``route_options`` as
        for ``add_api_route``: status code, response model, documented responses…)."""
        self.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=LeanRoute, **route_options
        )
        self.lean_routes[self.prefix + path] = endpoint


class LeanApp(FastAPI):
    """A ``FastAPI`` that serves its lean ``POST`` routes ahead of the framework.

    Measured on the agents' endpoint with its service stubbed out, server CPU per request over
    HTTP: 0.24 ms through FastAPI's stack and a :class:`LeanRoute`, 0.09 ms for a bare ASGI
    callable; the difference is the middleware stack, the router and the request object, all
    paid again per request. A lane skips them for the one case the route exists for:

    - the request still goes through the app's own middleware (``add_middleware``: the token
      check, the body limit), rebuilt around the lane from the same declarations;
    - the body is validated straight from bytes; an endpoint's exception is answered by the
      app's exception handlers, as the router would have it answered;
    - anything else — a body that is empty, not JSON or not valid — is handed, body and all, to
      the full app, which answers it exactly as for any route.

    Only routes of a :class:`LeanRouter` included with no options of its own (no prefix,
    dependencies or limits the lane would have to reproduce) get a lane, and none do when the
    app has a root path, app-wide dependencies, a framework body limit, or OpenTelemetry
    configured when the first request arrives (FastAPI's telemetry then traces every request
    through its stack).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self._lean_endpoints: dict[str, Endpoint] = {}
        self._lanes: dict[str, ASGIApp] | None = None

    def include_router(self, router: APIRouter, **options: Any) -> None:
        if isinstance(router, LeanRouter) and router.lean_routes and options.get("dependencies"):
            raise TypeError(
                "a LeanRouter's lean routes solve no dependencies: check what they would in "
                "the endpoint, or include them without dependencies"
            )
        super().include_router(router, **options)
        if isinstance(router, LeanRouter) and not options and not router.dependencies:
            self._lean_endpoints.update(router.lean_routes)
            self._lanes = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            lanes = self._lanes
            if lanes is None:
                lanes = self._lanes = self._build_lanes()
            lane = lanes.get(scope["path"])
            if lane is not None:
                await lane(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def _build_lanes(self) -> dict[str, ASGIApp]:
        telemetry = getattr(self, "_native_telemetry", None)
        if (
            self.root_path
            or self.max_body_size is not None
            or self.router.dependencies
            or (telemetry is not None and telemetry.enabled())
        ):
            return {}
        lanes: dict[str, ASGIApp] = {}
        for path, endpoint in self._lean_endpoints.items():
            lane: ASGIApp = _Lane(self, _body_model(endpoint), endpoint)
            for middleware in reversed(self.user_middleware):
                factory = cast(Callable[..., ASGIApp], middleware.cls)
                lane = factory(lane, *middleware.args, **middleware.kwargs)
            lanes[path] = lane
        return lanes

    async def _full(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)


class _Lane:
    """One lean route served directly (inside the app's own middleware)."""

    __slots__ = ("app", "endpoint", "model")

    def __init__(self, app: LeanApp, model: type[BaseModel], endpoint: Endpoint) -> None:
        self.app = app
        self.model = model
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = await read_body(receive)
        if body is None:
            return  # the client went away before sending its body
        replayed = replay_body(body, receive)
        if not body or not _is_json(Headers(scope=scope).get("content-type", "")):
            await self.app._full(scope, replayed, send)
            return
        try:
            parsed = self.model.model_validate_json(body)
        except ValidationError:
            # The full app validates it again and answers the 422 its one way.
            await self.app._full(scope, replayed, send)
            return
        scope["app"] = self.app
        try:
            response = await self.endpoint(parsed)
        except Exception as e:
            handler = self._handler_for(e)
            if handler is None:
                raise
            answer = handler(Request(scope, replayed), e)
            response = await answer if inspect.isawaitable(answer) else answer
        await response(scope, replayed, send)

    def _handler_for(self, error: Exception) -> Callable[..., Any] | None:
        handlers = self.app.exception_handlers
        for kind in type(error).__mro__:
            if kind in handlers:
                return handlers[kind]
        return None


async def read_body(receive: Receive) -> bytes | None:
    """The whole request body from ASGI ``receive``; ``None`` if the client went away first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)
