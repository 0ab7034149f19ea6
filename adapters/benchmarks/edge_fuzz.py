"""Hostile inputs at every route of every listener, from outside: no ``5xx``, nothing appended.

:func:`fuzz_listeners` runs ``fleetledger serve`` (the API, the agents' endpoint and the
scheduler extender on a listener of its own, over a fake cloud and cluster) on a scratch
database beside ``url`` and sends each route hostile inputs over real connections: bodies nested
10,000 deep, ``NaN`` and ``Infinity``, numbers past any range, lone surrogates, NUL and ESC in
text, wrong types, oversized strings, ids holding ``/`` and ``?`` and control characters in the
path. The route list is read from the running API's OpenAPI document and from the extender's
route table (:func:`~fleetledger.adapters.extender.server.extender_routes`), so a new route is
fuzzed without anyone listing it here. Each body is a valid one (built from the route's schema,
or from the extender's wire encoder) with one field replaced by a hostile value, so that the
refusal is that field's.

It counts the answers that were ``5xx`` (``server_errors``) and the events appended meanwhile
(``appended``): both must be 0, and the listeners must still answer afterwards.
:func:`idle_connections_closed` opens idle keep-alive sockets and counts those the server closes
past its idle timeout.

The generators (:func:`hostile_values`, :func:`mutations`, :func:`skeleton`) are shared with the
property test, which draws the same kinds of input from hypothesis.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from fleetledger.adapters.extender import wire
from fleetledger.adapters.extender.server import extender_routes
from fleetledger.domain.testbeds import SLOT_IDS_ANNOTATION, TESTBED_ANNOTATION
from fleetledger.eventstore import open_store

from .scratch import scratch_database

__all__ = [
    "HOSTILE_PATH_SEGMENTS",
    "IDLE_WAIT_SECONDS",
    "Route",
    "Served",
    "appended_since",
    "extender_route_list",
    "fuzz_served",
    "idle_connections_closed_at",
    "fuzz_listeners",
    "hostile_bodies",
    "hostile_values",
    "idle_connections_closed",
    "mutations",
    "probes_under_idle_flood",
    "quiet_head",
    "routes_of",
    "serving",
    "skeleton",
]

_MARK = "\u2063fuzz\u2063"
"""Stands for the hostile value in a body's JSON until the raw fragment replaces it."""
_DEEP = 10_000
IDLE_WAIT_SECONDS = 10.0
"""Past the listeners' idle timeout (5 s), with room for a loaded machine."""

HOSTILE_PATH_SEGMENTS: tuple[str, ...] = (
    "a%2Fb",
    "a%3Fb",
    "a%00b",
    "a%1Bb",
    "%ED%A0%80",  # a lone surrogate, UTF-8-encoded
    "%FF%FE",
    "x" * 5000,
    "%20",
    "..",
)


def hostile_values(*, id_like: bool = False) -> list[bytes]:
    """JSON fragments no field takes under the edge rule (``id_like``: with the ones only ids
    refuse, such as ``a/b?c``)."""
    values = [
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e308",
        b"-1e308",
        b"1e400",
        b"18446744073709551616",
        b'"\\ud800"',
        b'"a\\udc00b"',
        b'"a\\u0000b"',
        b'"a\\u001bb"',
        b'"\\u007f"',
        b'"' + b"x" * 100_000 + b'"',
        b"[" * _DEEP + b"]" * _DEEP,
        b'{"a":' * 200 + b"1" + b"}" * 200,
    ]
    if id_like:
        values += [b'"a/b?c"', b'"a b"', b'"\\u00e9t\\u00e9"', b'"a%2Fb"']
    return values


def hostile_bodies() -> list[bytes]:
    """Whole bodies that are no route's: not JSON, not UTF-8, too deep, not an object."""
    return [
        b"",
        b"{",
        b"\xff\xfe\x00",
        b"[" * _DEEP + b"]" * _DEEP,
        b"NaN",
        b'"\\ud800"',
        b"[]",
        b"null",
        b'{"a": Infinity}',
        b"1e400",
    ]


# -- routes ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """One route of one listener; ``body`` is a valid body (None: the route takes none)."""

    listener: str
    method: str
    path: str
    body: Any = None

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(re.findall(r"\{([^}:]+)(?::[^}]*)?\}", self.path))

    def url(self, values: Mapping[str, str] | None = None) -> str:
        path = self.path
        for name in self.parameters:
            given = (values or {}).get(name, "a1")
            path = re.sub(r"\{" + name + r"(?::[^}]*)?\}", given, path)
        return path


def routes_of(openapi: Mapping[str, Any]) -> list[Route]:
    """The API's routes from its OpenAPI document, each with a valid body where it takes one;
    the agents' endpoint is its own listener in the report."""
    routes = []
    components = openapi.get("components", {}).get("schemas", {})
    for path, operations in openapi.get("paths", {}).items():
        for method, operation in operations.items():
            schema = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            listener = "agents" if path.startswith("/v1/agent/") else "api"
            if schema is None:
                routes.append(Route(listener, method.upper(), path))
                continue
            # The simplest valid body, and one with every optional field too, so that the
            # optional fields (an id, a selector, GPU types…) are fuzzed as well.
            minimal = skeleton(schema, components)
            full = skeleton(schema, components, optional=True)
            routes.append(Route(listener, method.upper(), path, minimal))
            if full != minimal:
                routes.append(Route(listener, method.upper(), path, full))
    return routes


def extender_route_list() -> list[Route]:
    """The extender's routes, each ``POST`` with a valid body of both wire forms' first."""
    pod = wire.ExtenderPod(
        name="p1",
        namespace="jobs",
        uid="u1",
        annotations={TESTBED_ANNOTATION: "bed", SLOT_IDS_ANNOTATION: "1"},
    )
    bodies: dict[str, object] = {
        # Whole nodes: the node objects, passed back as they came, are fuzzed too.
        "/filter": wire.encode_filter_args(
            wire.FilterArgs(
                pod,
                ("n1",),
                ({"metadata": {"name": "n1"}, "status": {"capacity": {"cpu": "4"}, "n": 1}},),
            )
        ),
        "/preempt": wire.encode_preempt_args(
            wire.PreemptArgs(pod, {"n1": wire.MetaVictims(("v1",))})
        ),
    }
    return [
        Route("extender", method, path, bodies.get(path) if method == "POST" else None)
        for path, method in extender_routes().items()
    ]


def skeleton(
    schema: Mapping[str, Any], components: Mapping[str, Any], *, optional: bool = False
) -> Any:
    """A value valid for ``schema`` (the simplest that is; with ``optional``, with every optional
    field and a list item where one may be): what a hostile field is put into."""
    return _Skeleton(components, optional=optional).value(schema, 0)


class _Skeleton:
    _WORDS = ("a1", "a", "ab", "abc", "x-1", "default", "Standard_D4s_v5", "a.b", "1", "1.31.2")

    def __init__(self, components: Mapping[str, Any], *, optional: bool) -> None:
        self.components = components
        self.optional = optional

    def value(self, schema: Mapping[str, Any], depth: int) -> Any:
        if depth > 20:
            return None
        if "$ref" in schema:
            return self.value(self.components[schema["$ref"].rsplit("/", 1)[1]], depth + 1)
        for combined in ("anyOf", "oneOf", "allOf"):
            if combined in schema:
                options = [o for o in schema[combined] if o.get("type") != "null"]
                return self.value(options[-1] if combined != "allOf" else options[0], depth + 1)
        if "const" in schema:
            return schema["const"]
        if "enum" in schema:
            return schema["enum"][0]
        if "default" in schema and not self.optional and schema.get("type") != "object":
            return schema["default"]
        kind = schema.get("type")
        if kind == "object" or "properties" in schema:
            properties = schema.get("properties", {})
            names = properties if self.optional else schema.get("required", [])
            return {
                name: self.value(properties[name], depth + 1)
                for name in names
                if name in properties
            }
        if kind == "array":
            count = max(schema.get("minItems", 0), 1 if self.optional else 0)
            return [self.value(schema.get("items", {}), depth + 1) for _ in range(count)]
        if kind == "integer":
            return max(int(schema.get("minimum", 1)), min(1, int(schema.get("maximum", 1))))
        if kind == "number":
            return float(max(schema.get("minimum", 1), min(1, schema.get("maximum", 1))))
        if kind == "boolean":
            return False
        if kind == "string":
            return self._text(schema)
        return None

    def _text(self, schema: Mapping[str, Any]) -> str:
        pattern = schema.get("pattern")
        low: int = schema.get("minLength", 0)
        high: int = schema.get("maxLength", 1 << 30)
        for word in self._WORDS:
            if low <= len(word) <= high and (pattern is None or re.search(pattern, word)):
                return word
        return "a" * max(1, low)


# -- inputs ---------------------------------------------------------------------------------------


def mutations(body: Any) -> Iterator[tuple[str, bytes]]:
    """``body`` with each field (nested ones too) replaced in turn by each hostile value, as raw
    JSON: ``(where, bytes)``."""
    for loc, key in _fields(body, ()):
        for fragment in hostile_values(id_like=key in _ID_KEYS):
            yield "/".join(map(str, loc)), _replaced(body, loc, fragment)


_ID_KEYS = frozenset(
    {"id", "request_id", "name", "pod", "machine_name", "selector", "testbed", "job", "uid"}
)


def _fields(value: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield (*loc, key), str(key)
            yield from _fields(item, (*loc, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield (*loc, index), str(loc[-1]) if loc else ""
            yield from _fields(item, (*loc, index))


def _replaced(body: Any, loc: tuple[str | int, ...], fragment: bytes) -> bytes:
    copy = json.loads(json.dumps(body))
    target = copy
    for part in loc[:-1]:
        target = target[part]
    target[loc[-1]] = _MARK
    text = json.dumps(copy, ensure_ascii=True).encode()
    return text.replace(json.dumps(_MARK, ensure_ascii=True).encode(), fragment, 1)


def _inputs(route: Route, count: int, rng: random.Random) -> list[tuple[str, str, bytes]]:
    """``count`` hostile calls of ``route``: ``(url, what, body)``."""
    candidates: list[tuple[str, str, bytes]] = []
    if route.parameters:
        for segment in HOSTILE_PATH_SEGMENTS:
            values = dict.fromkeys(route.parameters, segment)
            body = b"" if route.body is None else json.dumps(route.body).encode()
            candidates.append((route.url(values), f"path {segment[:20]}", body))
    if route.method in ("POST", "PUT", "PATCH"):
        url = route.url()
        candidates += [(url, "body", body) for body in hostile_bodies()]
        if route.body is not None:
            candidates += [(url, f"field {where}", body) for where, body in mutations(route.body)]
    else:
        huge = "1" + "0" * 40
        for query in (
            "wait=NaN",
            "wait=1e308",
            "after=-1",
            f"after={huge}",
            "limit=1e400",
            f"as_of={huge}",
            "wait=%00",
        ):
            candidates.append((f"{route.url()}?{query}", f"query {query}", b""))
    rng.shuffle(candidates)
    return candidates[:count]


# -- serving --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Served:
    """A running ``fleetledger serve``: its API and extender base URLs and its database."""

    api: str
    extender: str
    database: str
    api_port: int


@contextlib.contextmanager
def serving(
    url: str | None, *, startup_timeout: float = 90.0, file_limit: int | None = None
) -> Iterator[Served]:
    """``fleetledger serve`` with the extender, a pool and a subnet, on a scratch database beside
    ``url`` (``file_limit``: with that many file descriptors at most); stopped (and the database
    dropped) afterwards."""
    with scratch_database(url) as database:
        api_port, extender_port = _free_port(), _free_port()
        command = [
            sys.executable,
            "-m",
            "fleetledger",
            "serve",
            "--url",
            database,
            "--host",
            "127.0.0.1",
            "--port",
            str(api_port),
            "--extender-port",
            str(extender_port),
            "--cluster",
            "fake",
            "--pool",
            "general=Standard_D4s_v5:4000:16",
            "--subnet",
            "aks-pods=1024",
            "--grace-seconds",
            "1",
        ]
        process = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # Before threads matter: the child sets its own limit between fork and exec.
            preexec_fn=None if file_limit is None else _limit_files(file_limit),  # noqa: PLW1509
        )
        served = Served(
            f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{extender_port}", database, api_port
        )
        try:
            _wait_ready(served, process, startup_timeout)
            yield served
        finally:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _limit_files(limit: int) -> Callable[[], None]:
    def apply() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))

    return apply


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait_ready(served: Served, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            error = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"serve exited with {process.returncode}: {error[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            api = httpx.get(f"{served.api}/readyz", timeout=2)
            extender = httpx.get(f"{served.extender}/readyz", timeout=2)
            if api.status_code == extender.status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"serve was not ready within {timeout} s")


def quiet_head(database: str, *, settle: float = 1.5, timeout: float = 30.0) -> int:
    """The log's head once nothing has been appended for ``settle`` seconds."""
    with contextlib.closing(open_store(database)) as store:
        head, since = store.head(), time.monotonic()
        deadline = since + timeout
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = store.head()
            if now != head:
                head, since = now, time.monotonic()
            elif time.monotonic() - since >= settle:
                return head
        return head


def appended_since(database: str, position: int) -> int:
    """Events appended after ``position`` but for the leadership's own (a re-election on a
    loaded machine appends ``LeaderElected`` whatever the requests do)."""
    count = 0
    with contextlib.closing(open_store(database)) as store:
        while events := store.read_all(after=position, limit=1000):
            count += sum(not e.stream_id.startswith(_OWN_STREAMS) for e in events)
            position = events[-1].global_position
    return count


_OWN_STREAMS = ("leadership-",)


# -- the measurements -----------------------------------------------------------------------------


def fuzz_listeners(url: str | None, *, inputs_per_route: int = 40, seed: int = 1) -> dict[str, Any]:
    """Hostile inputs at every route of the API, the agents' endpoint and the extender of a
    ``serve`` on a scratch database beside ``url`` (see the module docstring)."""
    rng = random.Random(seed)
    with serving(url) as served:
        return fuzz_served(served, inputs_per_route=inputs_per_route, rng=rng)


def fuzz_served(served: Served, *, inputs_per_route: int, rng: random.Random) -> dict[str, Any]:
    """:func:`fuzz_listeners` against a running ``serve``."""
    with httpx.Client(timeout=30) as client:
        openapi = client.get(f"{served.api}/openapi.json").json()
        routes = routes_of(openapi) + extender_route_list()
        head = quiet_head(served.database)
        counts = {"api": 0, "agents": 0, "extender": 0}
        failures: list[str] = []
        for route in routes:
            base = served.extender if route.listener == "extender" else served.api
            for path, what, body in _inputs(route, inputs_per_route, rng):
                counts[route.listener] += 1
                status = _send(client, route.method, base + path, body)
                if status >= 500:
                    failures.append(f"{route.method} {route.path} {what}: {status}")
        appended = appended_since(served.database, head)
        serves = all(
            client.get(f"{base}/readyz").status_code == 200
            for base in (served.api, served.extender)
        )
    return {
        "routes_fuzzed": len({(r.listener, r.method, r.path) for r in routes}),
        "hostile_inputs": counts,
        "server_errors": len(failures),
        "appended": appended,
        "serves_afterwards": serves,
        "failures": failures[:20],
    }


def _send(client: httpx.Client, method: str, url: str, body: bytes) -> int:
    headers = {"content-type": "application/json"} if body else {}
    try:
        return client.request(method, url, content=body, headers=headers).status_code
    except httpx.HTTPError:
        # The server closed or reset the connection: a refusal, not an error it answered.
        return 0


def idle_connections_closed(
    url: str | None, *, connections: int = 200, wait: float = IDLE_WAIT_SECONDS
) -> dict[str, int]:
    """Open ``connections`` sockets to a ``serve`` (beside ``url``), send a request on half of
    them (keep-alive) and nothing on the others, wait ``wait`` seconds, count those closed."""
    with serving(url) as served:
        return idle_connections_closed_at(
            "127.0.0.1", served.api_port, connections=connections, wait=wait
        )


def idle_connections_closed_at(
    host: str, port: int, *, connections: int, wait: float
) -> dict[str, int]:
    """:func:`idle_connections_closed` against a listener at ``host:port``."""
    sockets = []
    try:
        for index in range(connections):
            s = socket.create_connection((host, port), timeout=5)
            if index % 2:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: fuzz\r\n\r\n")
                s.recv(65536)
            sockets.append(s)
        time.sleep(wait)
        closed = sum(_closed(s) for s in sockets)
    finally:
        for s in sockets:
            s.close()
    return {"idle_connections": connections, "idle_connections_closed": closed}


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (what is left of an answer read first)."""
    s.settimeout(0.05)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def probes_under_idle_flood(
    url: str | None, *, file_limit: int = 1024, idle: int = 1100
) -> dict[str, int]:
    """``serve`` limited to ``file_limit`` descriptors, ``idle`` silent sockets held open on its
    API port: how many probes of 20 (``/healthz`` on a new connection, within 2 s each) are
    answered ``200`` while they are open."""
    with serving(url, file_limit=file_limit) as served:
        sockets = []
        try:
            for _ in range(idle):
                with contextlib.suppress(OSError):
                    sockets.append(socket.create_connection(("127.0.0.1", served.api_port), 5))
            answered = 0
            for _ in range(20):
                with contextlib.suppress(httpx.HTTPError):
                    answer = httpx.get(f"{served.api}/healthz", timeout=2)
                    answered += answer.status_code == 200
        finally:
            for s in sockets:
                s.close()
    return {"idle_sockets": len(sockets), "probes": 20, "probes_answered": answered}
