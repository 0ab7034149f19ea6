"""The kube-scheduler extender over HTTP (FastAPI), on its own port.

=====================  ========================================================================
``POST /filter``       ``ExtenderArgs`` → ``ExtenderFilterResult``: the node of the pod's slot
                       (reserving one, as an event, if it has none), or no node and the reason
                       for each candidate in ``FailedNodes``
``POST /preempt``      ``ExtenderPreemptionArgs`` → ``ExtenderPreemptionResult``: that node and,
                       as the victim, the slot's ghost pod (by UID)
``GET /healthz``       liveness
=====================  ========================================================================

Both forms of ``nodeCacheCapable`` are understood and answered in kind (:mod:`.wire`). Answers
come from the testbed's in-memory state (its hosted stream, after folding its new tail: one
indexed read). Only a new reservation writes to the log — appended, from a worker thread, with the
stream's expected version before the answer, so two pods racing for one slot conflict there and
the loser is decided again on the new state. A body that is not the v1 shape is a ``400``, and so
is a preemptor without its slot annotations; a pod without them gets an ``Error`` in the filter
result (it should not use this scheduler).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from fleetledger.adapters.testbeds import CommandRejected, TestbedsError, TestbedsService
from fleetledger.domain.testbeds import (
    FilterDecision,
    PodToPlace,
    PreemptDecision,
    filter_pod,
    preempt_pod,
    testbed,
)

from . import wire

__all__ = ["ExtenderDecider", "create_extender_app"]

log = structlog.get_logger(__name__)

_ATTEMPTS = 5


class ExtenderDecider:
    """Filter and preempt decisions for pods, with their reservations appended first."""

    def __init__(self, service: TestbedsService) -> None:
        self._service = service

    def filter(self, bed: str, pod: PodToPlace, candidates: tuple[str, ...]) -> FilterDecision:
        """The pod's node among ``candidates`` (see :func:`filter_pod`)."""
        unknown = self._unknown(bed)
        if unknown:
            return FilterDecision((), dict.fromkeys(candidates, unknown), ())
        decision = filter_pod(self._state(bed), pod, candidates, at=self._service.clock.now())
        for _ in range(_ATTEMPTS):
            if not decision.events:
                return decision
            self._reserve(bed, pod, candidates)
            decision = filter_pod(self._state(bed), pod, candidates, at=self._service.clock.now())
        return decision

    def preempt(self, bed: str, pod: PodToPlace) -> PreemptDecision:
        """The pod's node and its slot's ghost pod (see :func:`preempt_pod`)."""
        unknown = self._unknown(bed)
        if unknown:
            return PreemptDecision(None, (), (), unknown)
        decision = preempt_pod(self._state(bed), pod, at=self._service.clock.now())
        for _ in range(_ATTEMPTS):
            if not decision.events:
                return decision
            self._reserve(bed, pod, None)
            decision = preempt_pod(self._state(bed), pod, at=self._service.clock.now())
        return decision

    def _unknown(self, bed: str) -> str:
        if bed in self._service.testbeds():
            return ""
        self._service.catch_up()
        if bed in self._service.testbeds():
            return ""
        return f"no testbed named {bed}; define it before scheduling its jobs' pods"

    def _state(self, bed: str) -> testbed.TestbedState:
        # The leader records ghost pods and frees slots in another process: fold the stream's
        # new tail (usually nothing, one indexed read) before answering from memory.
        stream = self._service.testbed(bed)
        stream.load()
        return stream.state

    def _reserve(self, bed: str, pod: PodToPlace, candidates: tuple[str, ...] | None) -> None:
        # The host decides ReserveSlot again on the newest state if the stream moved; a refusal
        # means no slot is free any more, which the caller's next decision reports.
        try:
            self._service.execute(
                self._service.testbed(bed),
                lambda at: testbed.ReserveSlot(pod.name, pod.uid, pod.slot_ids, candidates, at=at),
                cause=f"extender:{pod.uid or pod.name}",
            )
        except CommandRejected:
            return


def create_extender_app(service: TestbedsService) -> FastAPI:
    """The extender's HTTP API over ``service`` (serve it on its own port)."""
    app = FastAPI(title="fleetledger scheduler extender", docs_url=None, redoc_url=None)
    decider = ExtenderDecider(service)

    async def body_of(request: Request) -> Mapping[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except ValueError as e:
            return JSONResponse({"detail": f"the body is not JSON: {e}"}, status_code=400)
        if not isinstance(body, Mapping):
            return JSONResponse({"detail": "the body must be a JSON object"}, status_code=400)
        return body

    @app.post("/filter")
    async def filter_endpoint(request: Request) -> JSONResponse:
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            args = wire.parse_filter_args(body)
        except wire.WireError as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        try:
            bed, pod = wire.pod_to_place(args.pod)
        except wire.WireError as e:
            result = wire.FilterResult((), error=str(e))
            return JSONResponse(wire.encode_filter_result(result, args=args))
        try:
            decision = await run_in_threadpool(decider.filter, bed, pod, args.node_names)
        except TestbedsError as e:
            log.warning("extender filter failed", pod=pod.name, error=str(e))
            result = wire.FilterResult((), error=str(e))
            return JSONResponse(wire.encode_filter_result(result, args=args))
        result = wire.FilterResult(decision.nodes, decision.failed)
        return JSONResponse(wire.encode_filter_result(result, args=args))

    @app.post("/preempt")
    async def preempt_endpoint(request: Request) -> JSONResponse:
        body = await body_of(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            args = wire.parse_preempt_args(body)
            bed, pod = wire.pod_to_place(args.pod)
        except wire.WireError as e:
            return JSONResponse({"detail": str(e)}, status_code=400)
        try:
            decision = await run_in_threadpool(decider.preempt, bed, pod)
        except TestbedsError as e:
            log.warning("extender preempt failed", pod=pod.name, error=str(e))
            return JSONResponse({"detail": str(e)}, status_code=503)
        victims = {}
        if decision.node is not None:
            victims[decision.node] = wire.MetaVictims(decision.victim_uids)
        return JSONResponse(wire.encode_preempt_result(wire.PreemptResult(victims)))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
