"""The kube-scheduler extender over HTTP, on a listener of its own.

=====================  ========================================================================
``POST /filter``       ``ExtenderArgs`` → ``ExtenderFilterResult``: the node of the pod's slot
                       (reserving one, as an event, if it has none), or no node and the reason
                       for each candidate in ``FailedNodes``
``POST /preempt``      ``ExtenderPreemptionArgs`` → ``ExtenderPreemptionResult``: that node, if
                       the scheduler listed it, and as the victim the slot's ghost pod (by UID)
``GET /healthz``       liveness
``GET /readyz``        readiness: the event log answers
``GET /metrics``       Prometheus metrics (:mod:`fleetledger.adapters.metrics`): the log's, and
                       this process's append latency; the same registry as the API's in ``serve``
=====================  ========================================================================

Both forms of ``nodeCacheCapable`` are understood and answered in kind (:mod:`.wire`), and pods
may ask in this project's annotations or in the original operator's labels.

**Edge rules**, the API's (:mod:`fleetledger.adapters.http`): with tokens configured every route
but the probes needs ``Authorization: Bearer <token>`` (:class:`~fleetledger.adapters.http.auth.
BearerAuth`; ``401`` otherwise); bodies over the limit get ``413`` before they are read
(:class:`~fleetledger.adapters.http.limits.BodySizeLimit`); a body that is not JSON, not an
object or not of the v1 shape gets ``422`` whose ``detail[].loc`` names the field at fault and
whose ``msg`` says why, never echoing the input — bodies are parsed by the edge rule
(:mod:`fleetledger.adapters.http.edge`: bounded nesting, finite numbers, no lone surrogates) and
what reaches the log (pod names and UIDs, node and testbed names) is held to Kubernetes' name
rules (:mod:`.wire`); ``503`` with ``Retry-After`` while the event log is unreachable, and from
``/readyz`` when reading the log does not finish within its deadline. The listener's connection
guards and TLS are :mod:`fleetledger.adapters.http.listener`'s. A pod without a slot request is
not the request's fault: the filter answers it in the result's ``Error`` (the scheduler reports
it on the pod), the preemption with ``422``.

**Answers come from memory; every new reservation is in the log first.** Each testbed's state
is its hosted stream's fold (:class:`~fleetledger.adapters.testbeds.TestbedsService`). A
reservation is appended with the stream's expected version before the answer, so two pods (or
two extender processes) racing for one slot conflict in the log and the loser is decided again
on the newer state. What is answered without appending is read as follows:

* a decision is taken on the fold without reading the log when the store's wake-ups show that
  no other process appended since it was read (their appends arrive as Postgres notifications;
  this process's own go through the hosted stream, which folds them as they commit; and a fold
  is never used once older than :data:`MAX_FOLD_AGE_SECONDS`). That is the common call — the
  scheduler asking again about a pod that holds a reservation — answered from memory; such an
  answer is as fresh as a read of the log taken as late as the last notification. On SQLite,
  which notifies no other process, the stream's tail is read on every call;
* an answer placing the pod nowhere is decided again on a fold that read the log's tail after
  the call arrived: a slot may have come free in another process since.

A pod that holds a reservation is answered from an index of the fold's reservations, built once
per folded state, rather than by deciding again over every slot.

The handlers are coroutines; reads of the log run in worker threads and a reservation is
appended by the stream's committer (:meth:`~fleetledger.adapters.runtime.HostedStream.decide`),
so no call holds the event loop while the database works.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import orjson
import structlog
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from fleetledger.adapters import runtime
from fleetledger.adapters.http import edge
from fleetledger.adapters.http.auth import ApiTokens, BearerAuth, check_exposure
from fleetledger.adapters.http.lean import read_body
from fleetledger.adapters.http.limits import (
    DEFAULT_MAX_BODY_BYTES,
    BodySizeLimit,
    checked_max_body_bytes,
)
from fleetledger.adapters.http.probes import ProbeTimeout, SingleFlightCheck
from fleetledger.adapters.metrics.http import MetricsEndpoint, metrics_registry
from fleetledger.adapters.testbeds import (
    InvalidTestbedCommand,
    LogContention,
    LogUnavailable,
    NotLeading,
    TestbedsError,
    TestbedsService,
)
from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.testbeds import (
    FilterDecision,
    PodToPlace,
    PreemptDecision,
    filter_pod,
    preempt_pod,
    testbed,
)
from fleetledger.eventstore import EventStoreError, InvalidEvent

from . import wire

__all__ = [
    "ENV_VARIABLE",
    "MAX_FOLD_AGE_SECONDS",
    "PUBLIC_PATHS",
    "ExtenderDecider",
    "check_extender_exposure",
    "create_extender_app",
    "extender_routes",
    "extender_tokens",
]

log = structlog.get_logger(__name__)

ENV_VARIABLE = "FLEETLEDGER_EXTENDER_TOKENS"
"""The extender's bearer tokens, comma-separated: not the API's (a scheduler's credential must
not create VMs)."""
MAX_FOLD_AGE_SECONDS = 1.0
"""The oldest fold a repeated question is answered from, whatever the wake-ups say: bounds what
a lost notification (the listener reconnecting) could hide."""
_LISTENER_WAIT_SECONDS = 5.0
_ATTEMPTS = 5
_LOG_RETRY_SECONDS = 5
_CONTENTION_RETRY_SECONDS = 1

T = TypeVar("T")
D = TypeVar("D", FilterDecision, PreemptDecision)


# -- decisions -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Load:
    """Effect: fold the testbed's stream tail (blocking: a read of the log) with a read that
    starts no earlier than ``after`` (``time.monotonic()``)."""

    bed: str
    after: float


@dataclass(frozen=True, slots=True)
class _CatchUp:
    """Effect: learn of testbeds defined since the last look (blocking)."""


@dataclass(frozen=True, slots=True)
class _Reserve:
    """Effect: append the pod's reservation at the stream's version (or learn it is refused)."""

    bed: str
    pod: PodToPlace
    candidates: tuple[str, ...] | None


_Effect: TypeAlias = _Load | _CatchUp | _Reserve
_Steps: TypeAlias = Generator[_Effect, tuple[testbed.TestbedEvent, ...] | None, T]
"""A decision's steps: each effect is sent back what it did (a reservation: the events the
log took, ``()`` when refused; anything else: ``None``)."""


def _same_events(
    appended: tuple[testbed.TestbedEvent, ...] | None, decided: tuple[testbed.TestbedEvent, ...]
) -> bool:
    """Whether the log took the very events decided, but for the time they were decided at."""
    if appended is None or len(appended) != len(decided):
        return False
    return all(
        type(a) is type(d) and dataclasses.replace(a, at=d.at) == d
        for a, d in zip(appended, decided, strict=True)
    )


class ExtenderDecider:
    """Filter and preempt decisions for pods, with their reservations appended first.

    :meth:`filter` and :meth:`preempt` block (for callers on a thread: the simulator, tests);
    :meth:`afilter` and :meth:`apreempt` are the same decisions for an event loop. Raises
    :class:`~fleetledger.adapters.testbeds.InvalidTestbedCommand` for a pod whose slot request
    the testbed cannot take at all, and the other
    :class:`~fleetledger.adapters.testbeds.TestbedsError` when the log is unreachable or keeps
    moving. ``max_fold_age``: see :data:`MAX_FOLD_AGE_SECONDS`.
    """

    def __init__(
        self, service: TestbedsService, *, max_fold_age: float = MAX_FOLD_AGE_SECONDS
    ) -> None:
        self._service = service
        self._max_fold_age = max_fold_age
        self._store = service.store
        self._known: frozenset[str] = frozenset()
        # Per testbed: the store's wake sequence read before its last fold, and when that was.
        self._folded: dict[str, tuple[int, float]] = {}
        # Per testbed: a fold's wake sequence and a later one at which no notification had come
        # since the fold was read.
        self._fresh_at: dict[str, tuple[int, int]] = {}
        # Per testbed: the read of its stream in flight (when it started, and its future).
        self._flights: dict[str, tuple[float, asyncio.Future[None]]] = {}
        self._wakeups_trusted = False

    # -- the decisions, as steps with effects ----------------------------------------------------

    def _filtering(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...]
    ) -> _Steps[FilterDecision]:
        unknown = yield from self._unknown(bed)
        if unknown:
            return FilterDecision((), dict.fromkeys(candidates, unknown), ())
        return (
            yield from self._deciding(
                bed,
                lambda: self._decide_filter(bed, pod, candidates),
                lambda decision: bool(decision.nodes),
                _Reserve(bed, pod, candidates),
            )
        )

    def _preempting(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...] | None
    ) -> _Steps[PreemptDecision]:
        unknown = yield from self._unknown(bed)
        if unknown:
            return PreemptDecision(None, (), (), unknown)
        return (
            yield from self._deciding(
                bed,
                lambda: self._decide_preempt(bed, pod, candidates),
                lambda decision: decision.node is not None,
                _Reserve(bed, pod, candidates),
            )
        )

    def _deciding(
        self,
        bed: str,
        decide: Callable[[], D],
        placed: Callable[[D], bool],
        reservation: _Reserve,
    ) -> _Steps[D]:
        """Decide on the fold (read first when it may be stale); append the reservation the
        decision makes and decide again; read the log once before answering "nowhere"."""
        arrived = time.monotonic()
        fresh = False
        if self._stale(bed):
            # A read that started before the wake-up just seen might have missed its append.
            yield _Load(bed, time.monotonic())
            fresh = True
        decision = decide()
        for _ in range(_ATTEMPTS):
            if decision.events:
                # The host appends at the stream's version and decides again on the newest
                # state if it moved: the reservation answered is the log's, not this fold's.
                appended = yield reservation
                if _same_events(appended, decision.events):
                    return decision  # what was decided here is what the log took
            elif placed(decision) or fresh:
                return decision
            else:
                # Nowhere: a slot may have come free in another process since the last fold.
                yield _Load(bed, arrived)
                fresh = True
            decision = decide()
        return decision

    def _unknown(self, bed: str) -> _Steps[str]:
        if bed in self._known:
            return ""
        yield _CatchUp()
        if bed in self._known:
            return ""
        return f"no testbed named {bed}; define it before scheduling its jobs' pods"

    def _decide_filter(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...]
    ) -> FilterDecision:
        state = self._service.testbed(bed).state
        # The pod holds a reservation: filter_pod's answer then depends on that slot alone, and
        # finding it (every slot's state) is done once per folded state.
        slot = testbed.reservation_of(state, pod.name)
        if slot is None:
            return filter_pod(state, pod, candidates, at=self._service.clock.now())
        return _held(pod, slot, candidates)

    def _decide_preempt(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...] | None
    ) -> PreemptDecision:
        state = self._service.testbed(bed).state
        return preempt_pod(state, pod, at=self._service.clock.now(), candidate_nodes=candidates)

    def _stale(self, bed: str) -> bool:
        folded = self._folded.get(bed)
        if folded is None or not self._wakeups_trusted:
            return True
        seen, at = folded
        if time.monotonic() - at > self._max_fold_age:
            return True
        # Every wake-up, a notification's or this process's own append, moves the sequence: while
        # it stays where the last check found no notification since ``seen``, none came since.
        now = self._store.wake_sequence()
        if self._fresh_at.get(bed) == (seen, now):
            return False
        # Without waiting: True when another process appended since the wake sequence ``seen``
        # (a notification wakes every waiter). This process's own appends to a testbed need no
        # read: they go through the service's hosted stream, which folds them as they commit.
        if self._store.wait_for_wake(seen, 0, types=()):
            return True
        self._fresh_at[bed] = (seen, now)
        return False

    # -- blocking effects ------------------------------------------------------------------------

    def _load(self, bed: str) -> None:
        # Read before the fold: an append that lands during it makes the next call read again.
        seen = self._store.wake_sequence()
        try:
            self._service.testbed(bed).load()
        except EventStoreError as e:
            raise LogUnavailable(f"the event log is unreachable: {e}") from e
        self._folded[bed] = (seen, time.monotonic())

    def _catch_up(self) -> None:
        try:
            self._service.catch_up()
        except EventStoreError as e:
            raise LogUnavailable(f"the event log is unreachable: {e}") from e
        self._known = frozenset(self._service.testbeds())

    def _reserve(self, effect: _Reserve) -> tuple[testbed.TestbedEvent, ...]:
        stream = self._service.testbed(effect.bed)
        try:
            return stream.execute(self._reservation(effect)).events
        except BaseException as e:
            _raise_translated(e)
        return ()

    def _reservation(self, effect: _Reserve) -> runtime.Plan[testbed.TestbedCommand]:
        pod = effect.pod
        cause = f"extender:{pod.uid or pod.name}"
        return lambda at: [
            (testbed.ReserveSlot(pod.name, pod.uid, pod.slot_ids, effect.candidates, at=at), cause)
        ]

    def _run(self, steps: _Steps[T]) -> T:
        try:
            effect = next(steps)
            while True:
                outcome: tuple[testbed.TestbedEvent, ...] | None = None
                if isinstance(effect, _Load):
                    self._load(effect.bed)
                elif isinstance(effect, _CatchUp):
                    self._catch_up()
                else:
                    outcome = self._reserve(effect)
                effect = steps.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result

    async def _aload(self, effect: _Load) -> None:
        """One read for every caller that needs it: a read in flight that started late enough
        is joined; one that started too early is waited for, then another starts. Reads of one
        stream take its fold's lock one at a time anyway, and after a notification every call
        in flight would otherwise read the same tail."""
        while (flight := self._flights.get(effect.bed)) is not None and not flight[1].done():
            started, reading = flight
            if started >= effect.after:
                await asyncio.shield(reading)
                return
            with contextlib.suppress(TestbedsError):
                await asyncio.shield(reading)
        started = time.monotonic()
        reading = asyncio.get_running_loop().run_in_executor(None, self._load, effect.bed)
        self._flights[effect.bed] = (started, reading)
        try:
            await asyncio.shield(reading)
        finally:
            if self._flights.get(effect.bed) == (started, reading):
                del self._flights[effect.bed]

    async def _arun(self, steps: _Steps[T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            effect = next(steps)
            while True:
                outcome: tuple[testbed.TestbedEvent, ...] | None = None
                if isinstance(effect, _Load):
                    await self._aload(effect)
                elif isinstance(effect, _CatchUp):
                    await loop.run_in_executor(None, self._catch_up)
                else:
                    stream = self._service.testbed(effect.bed)
                    outcome = ()
                    try:
                        outcome = (await stream.decide(self._reservation(effect))).events
                    except BaseException as e:
                        _raise_translated(e)
                effect = steps.send(outcome)
        except StopIteration as done:
            result: T = done.value
            return result

    # -- the API ---------------------------------------------------------------------------------

    def filter(self, bed: str, pod: PodToPlace, candidates: tuple[str, ...]) -> FilterDecision:
        """The pod's node among ``candidates`` (see :func:`filter_pod`)."""
        return self._run(self._filtering(bed, pod, candidates))

    def preempt(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...] | None = None
    ) -> PreemptDecision:
        """The pod's node among ``candidates`` (``None``: any) and its slot's ghost pod (see
        :func:`preempt_pod`)."""
        return self._run(self._preempting(bed, pod, candidates))

    async def afilter(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...]
    ) -> FilterDecision:
        """:meth:`filter` on an event loop."""
        if bed in self._known and not self._stale(bed):
            # The common call, a pod asking again about the slot it holds on a fresh fold, is
            # answered as the steps would answer it, without running them.
            slot = testbed.reservation_of(self._service.testbed(bed).state, pod.name)
            if slot is not None and slot.node in candidates:
                return _held(pod, slot, candidates)
        return await self._arun(self._filtering(bed, pod, candidates))

    async def apreempt(
        self, bed: str, pod: PodToPlace, candidates: tuple[str, ...] | None = None
    ) -> PreemptDecision:
        """:meth:`preempt` on an event loop."""
        return await self._arun(self._preempting(bed, pod, candidates))

    def prime(self, *, listener_wait: float = _LISTENER_WAIT_SECONDS) -> None:
        """Learn the testbeds, and on Postgres wait (up to ``listener_wait``) for the store's
        notification listener, after which repeated questions may skip reading the log.

        Never raises: an unreachable log is the calls' ``503`` until it answers again.
        """
        try:
            self._catch_up()
        except TestbedsError as e:
            log.warning("extender started without reading the log", error=str(e))
        if self._store.backend.is_sqlite:
            return
        # The listener wakes every waiter once it is listening ("anything committed while we
        # were not"); an empty type filter waits for exactly such a wake-up.
        seen = self._store.wake_sequence()
        self._wakeups_trusted = self._store.wait_for_wake(seen, listener_wait, types=())
        if not self._wakeups_trusted:
            log.warning("no notification listener; the extender reads the log on every call")


def _held(pod: PodToPlace, slot: testbed.Slot, candidates: tuple[str, ...]) -> FilterDecision:
    """:func:`filter_pod`'s answer for a pod that holds ``slot``."""
    elsewhere = f"pod {pod.name} has slot {slot.slot_id}, which is on node {slot.node}"
    if slot.node not in candidates:
        return FilterDecision((), dict.fromkeys(candidates, elsewhere), ())
    return FilterDecision((slot.node,), {n: elsewhere for n in candidates if n != slot.node}, ())


def _raise_translated(error: BaseException) -> None:
    """Raise the testbeds error for a reservation's failure; a refusal (no slot free any more)
    is not one: the next decision reports it."""
    if isinstance(error, runtime.CommandRefused):
        if isinstance(error.error, InvalidCommand):
            raise InvalidTestbedCommand(error.error.reason) from error
        return
    if isinstance(error, InvalidCommand):
        raise InvalidTestbedCommand(error.reason) from error
    refused = error if isinstance(error, InvalidEvent) else error.__cause__
    if isinstance(refused, InvalidEvent):
        # The log refused the value (the request's fault), which is no outage.
        raise InvalidTestbedCommand(f"the log refuses the reservation: {refused}") from error
    if isinstance(error, runtime.LogUnavailable | EventStoreError):
        raise LogUnavailable(f"the event log is unreachable: {error}") from error
    if isinstance(error, runtime.LogContention):
        raise LogContention(str(error)) from error
    if isinstance(error, runtime.Deposed):
        raise NotLeading(str(error)) from error
    raise error


# -- tokens --------------------------------------------------------------------------------------


def extender_tokens(
    given: Iterable[str] | None, environ: Mapping[str, str] | None = None
) -> ApiTokens | None:
    """The extender's tokens: ``given`` (``--extender-token``), else :data:`ENV_VARIABLE`, else
    ``None``. A ``ValueError`` says which token is unusable and why."""
    if given:
        tokens = list(given)
        source = "--extender-token"
    else:
        text = (os.environ if environ is None else environ).get(ENV_VARIABLE, "")
        tokens = [part.strip() for part in text.split(",") if part.strip()]
        source = ENV_VARIABLE
    if not tokens:
        return None
    try:
        return ApiTokens(tokens)
    except ValueError as e:
        raise ValueError(f"{source}: {e}".replace("API token", "extender token")) from None


def check_extender_exposure(
    host: str, tokens: ApiTokens | None, *, allow_open: bool, tls: bool = False
) -> None:
    """Refuse (``ValueError``) an extender beyond loopback with neither tokens nor TLS unless
    ``allow_open``: anyone reaching it in plain text could reserve every slot."""
    try:
        check_exposure(host, tokens, allow_open=allow_open or tls)
    except ValueError:
        raise ValueError(
            f"refusing to serve the extender on {host} with neither extender tokens nor TLS: "
            f"serve it over TLS (--tls-cert/--tls-key; the scheduler's enableHTTPS), or set "
            f"{ENV_VARIABLE}=<token>[,<token>…] (or --extender-token) behind an authenticating "
            "proxy, since the kube-scheduler sends no bearer token; keep it on 127.0.0.1 beside "
            "the scheduler; or pass --insecure-no-auth"
        ) from None


# -- HTTP ----------------------------------------------------------------------------------------


class _Refused(Exception):
    """A call answered with an error status (``detail`` is the JSON body's)."""

    def __init__(self, status: int, detail: object, *, retry_after: int | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.detail = detail
        self.retry_after = retry_after


def _invalid(loc: wire.Loc, msg: str, kind: str) -> _Refused:
    return _Refused(422, [{"loc": ["body", *loc], "msg": msg, "type": kind}])


def _unavailable(error: TestbedsError) -> _Refused:
    retry = _CONTENTION_RETRY_SECONDS if isinstance(error, LogContention) else _LOG_RETRY_SECONDS
    return _Refused(503, str(error), retry_after=retry)


_ROUTES: dict[str, tuple[str, str]] = {
    "/filter": ("POST", "_filter"),
    "/preempt": ("POST", "_preempt"),
    "/healthz": ("GET", "_healthz"),
    "/readyz": ("GET", "_readyz"),
}
"""Each path, the method it takes and the handler serving it."""


def extender_routes() -> dict[str, str]:
    """Each route of the extender and the method it takes (for tools that walk every route)."""
    return {path: method for path, (method, _) in _ROUTES.items()}


_JSON_HEADERS = [(b"content-type", b"application/json")]
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
"""The probes and the metrics: answered without a token, as on the API."""
_PUBLIC = PUBLIC_PATHS


class _ExtenderApp:
    """The routes (see the module docstring) as a plain ASGI app: on the two calls the scheduler
    makes for every pod, a framework's routing, request objects and validation would cost more
    than the decision."""

    def __init__(self, decider: ExtenderDecider, service: TestbedsService) -> None:
        self._decider = decider
        self._service = service
        # Readiness answers within its deadline whatever the database does; one read of the
        # head at a time, joined by the probes that arrive meanwhile.
        self._head = SingleFlightCheck(service.store.head, what="reading the log's head")
        self._routes: dict[str, tuple[str, Callable[[bytes], Any]]] = {
            path: (method, getattr(self, handler)) for path, (method, handler) in _ROUTES.items()
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets here; the server closes the connection
        path = scope["path"]
        route = self._routes.get(path)
        try:
            if route is None:
                raise _Refused(404, f"no route {path}; the extender serves /filter and /preempt")
            method, handler = route
            if scope["method"] != method:
                raise _Refused(405, f"{path} takes {method}")
            body = await read_body(receive)
            if body is None:
                return  # the client went away
            status, answer = 200, await handler(body)
            headers = _JSON_HEADERS
        except _Refused as refused:
            status, answer = refused.status, {"detail": refused.detail}
            headers = list(_JSON_HEADERS)
            if refused.retry_after is not None:
                headers.append((b"retry-after", str(refused.retry_after).encode()))
            if refused.status == 405:
                headers.append((b"allow", route[0].encode() if route else b""))
            self._log_refusal(path, refused)
        payload = orjson.dumps(answer)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"content-length", str(len(payload)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await asyncio.get_running_loop().run_in_executor(None, self._decider.prime)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    def _log_refusal(path: str, refused: _Refused) -> None:
        if refused.status >= 500:
            log.error(
                "extender call failed", path=path, status=refused.status, error=refused.detail
            )
        elif isinstance(refused.detail, list):
            # Where and why, never the body: it may be large, or hold what logs must not.
            fields = [".".join(map(str, d["loc"])) for d in refused.detail]
            log.info("extender call refused", path=path, status=refused.status, fields=fields)
        else:
            log.info("extender call refused", path=path, status=refused.status)

    # -- routes ----------------------------------------------------------------------------------

    async def _filter(self, body: bytes) -> object:
        try:
            args = wire.parse_filter_args(_json_object(body))
        except wire.WireError as e:
            raise _invalid(e.loc, e.reason, "value_error") from e
        try:
            bed, pod = wire.pod_to_place(args.pod)
        except wire.WireError as e:
            # The pod's fault, not the call's: the scheduler reports the error on the pod.
            return wire.encode_filter_result(wire.FilterResult((), error=str(e)), args=args)
        try:
            decision = await self._decider.afilter(bed, pod, args.node_names)
        except InvalidTestbedCommand as e:
            return wire.encode_filter_result(wire.FilterResult((), error=str(e)), args=args)
        except TestbedsError as e:
            raise _unavailable(e) from e
        result = wire.FilterResult(decision.nodes, decision.failed)
        return wire.encode_filter_result(result, args=args)

    async def _preempt(self, body: bytes) -> object:
        try:
            args = wire.parse_preempt_args(_json_object(body))
            bed, pod = wire.pod_to_place(args.pod)
        except wire.WireError as e:
            raise _invalid(e.loc, e.reason, "value_error") from e
        try:
            decision = await self._decider.apreempt(bed, pod, args.candidate_nodes)
        except InvalidTestbedCommand as e:
            raise _invalid(("Pod",), str(e), "value_error") from e
        except TestbedsError as e:
            raise _unavailable(e) from e
        victims = {}
        if decision.node is not None:
            victims[decision.node] = wire.MetaVictims(decision.victim_uids)
        return wire.encode_preempt_result(wire.PreemptResult(victims))

    async def _healthz(self, body: bytes) -> object:
        return {"status": "ok"}

    async def _readyz(self, body: bytes) -> object:
        try:
            position = await self._head.run()
        except ProbeTimeout as e:
            raise _Refused(503, str(e), retry_after=_LOG_RETRY_SECONDS) from e
        except EventStoreError as e:
            raise _Refused(
                503, f"the event log is unreachable: {e}", retry_after=_LOG_RETRY_SECONDS
            ) from e
        return {"status": "ready", "log_position": position}


def _json_object(body: bytes) -> Mapping[str, object]:
    try:
        parsed = edge.loads(body)
    except edge.EdgeError as e:
        raise _invalid(e.loc, e.reason, e.kind) from e
    if not isinstance(parsed, dict):
        raise _invalid((), "the body must be a JSON object", "model_attributes_type")
    return parsed


def create_extender_app(
    service: TestbedsService,
    *,
    tokens: ApiTokens | Iterable[str] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    metrics: CollectorRegistry | None = None,
) -> ASGIApp:
    """The extender's HTTP app over ``service`` (serve it on a listener of its own): behind
    bearer ``tokens`` when given (the probes and ``/metrics`` stay open) and refusing bodies over
    ``max_body_bytes``; ``/metrics`` serves ``metrics`` (default: the log's metrics).
    ``ValueError`` for a token or limit that cannot be used."""
    limit = checked_max_body_bytes(max_body_bytes)
    if tokens is not None and not isinstance(tokens, ApiTokens):
        tokens = ApiTokens(tokens)
    app: ASGIApp = BodySizeLimit(_ExtenderApp(ExtenderDecider(service), service), max_bytes=limit)
    app = MetricsEndpoint(app, metrics_registry(service.store) if metrics is None else metrics)
    if tokens is not None:
        app = BearerAuth(app, tokens=tokens, public_paths=_PUBLIC)
    return app
