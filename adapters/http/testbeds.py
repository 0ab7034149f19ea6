"""The external scheduler's interface: testbeds, batch jobs and schedulings over HTTP, and a live
websocket watch of their changes (seed 05, "External Scheduler Interface").

=============================================  ==================================================
``POST /v1/testbeds``                          ``{name, node_label, slots_per_node, slot:
                                               {cpu_millis, memory_mib}}``: create (``201``) or
                                               resize (``200``) a testbed
``GET /v1/testbeds/{name}``                    definition, holder, slots (``id``, ``node``,
                                               ``position_on_node``, ``status``, ``pod``),
                                               overall ``state``, ``problems``
``DELETE /v1/testbeds/{name}``                 delete it (its ghost pods go); ``409`` while a
                                               scheduling holds it
``POST /v1/jobs``                              ``{name, kind: spark|flink, image, main_file,
                                               arguments}``: define a batch job (``201``)
``GET /v1/jobs/{name}``                        status, holder, application, slots, times,
                                               message, and ``runs``: every earlier run (its
                                               scheduling, slots, times and outcome)
``DELETE /v1/jobs/{name}``                     delete it; ``409`` while a scheduling holds it
``POST /v1/schedulings``                       ``{name, testbed, strategy: queue | slots_strict
                                               | slots_relaxed, queue: [job…] | items: [{job,
                                               slot_ids}]}``: create a scheduling (``201``)
``POST /v1/schedulings/{name}/queue``          ``{queue: [job…]} | {items: [...]}``: online
                                               scheduling, the running scheduling takes more
                                               jobs
``GET /v1/schedulings/{name}``                 phase, queue left, assignments, jobs and their
                                               statuses, last claim conflict
``DELETE /v1/schedulings/{name}``              release: its jobs (unfinished ones go back to
                                               ready, their applications deleted) and testbed
``GET /v1/testbeds``, ``/v1/jobs``,            one page: ``?after=POSITION&limit=N`` (``N`` ≤
``/v1/schedulings``                            500, default 100) → ``{"items": [...],
                                               "next_after": P | null}``
``WS /v1/watch?from=POSITION``                 every change as it is appended (:mod:`.watch`)
=============================================  ==================================================

Every resource carries ``created_position`` and ``position``: the global log positions of its
first and of its latest event. Listings are ordered by ``created_position`` — a resource keeps its
place however often it changes — and a page's ``next_after`` is the last item's
``created_position``: asking for ``after=next_after`` until it is ``null`` visits every resource
that existed throughout exactly once, and a resource created meanwhile on a later page. Deleted
testbeds and jobs are not listed and are ``404``; one defined again after its deletion is listed
where it was defined again.

Writes are events appended before the answer: ``{"position": P, "appended": true, "<kind>":
{...}}`` with ``201`` for a resource that did not exist, ``200`` otherwise; a repeat that changes
nothing is ``200`` with ``"appended": false`` and the position of the resource's latest event.

Errors, each with the app's ``{"detail": …}`` body, and nothing appended for any of them:
``422`` for a body that does not validate or that the aggregate refuses as malformed
(``detail[].loc`` names the field at fault, the input is not echoed back) — a job or testbed named
in a scheduling that does not exist included; ``404`` for an unknown name in the path; ``409``
with ``{"detail": {"reason": …, "holder": S | null}}`` when the command conflicts with what is
recorded: deleting a job or testbed a scheduling holds, creating or extending a scheduling with a
job another scheduling holds (a scheduling would wait for it; the interface refuses at once
instead), a name in use with another spec, a finished scheduling; ``503`` with ``Retry-After``
while the log is unreachable.

A job takes its slots' size from the testbed it runs on: there are no per-job resources (an
unknown field such as ``cpu_millis`` on a job is refused).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from fleetledger.adapters.testbeds import (
    CommandRejected,
    Conflict,
    InvalidTestbedCommand,
    LogContention,
    LogUnavailable,
    NotFound,
    NotLeading,
    TestbedsError,
    TestbedsRuntime,
    TestbedsService,
    Written,
)
from fleetledger.domain.template import text_problem
from fleetledger.domain.testbeds import (
    JobState,
    SchedulingState,
    SlotItem,
    TestbedState,
    application_name,
    overall_state,
    slots,
)
from fleetledger.eventstore import EventStoreError, InvalidEvent

from .watch import watch_router

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "ExtensionBody",
    "JobBody",
    "SchedulingBody",
    "SlotItemBody",
    "SlotSizeBody",
    "TestbedBody",
    "testbeds_router",
]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
_LOG_RETRY_SECONDS = 5
"""As the app's other routes: the log stays down for a while when it is down."""

# Kubernetes names (RFC 1123 labels): they name streams, pods, applications and labels.
_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_MAX_NAME = 63
_MAX_JOB_NAME = _MAX_NAME - len("-app")
"""A job's application is named ``<job>-app``, which must be a Kubernetes name too."""
# A label key: an optional DNS-subdomain prefix and "/", then a name of up to 63 characters.
_LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_MAX_LABEL_KEY = 253 + 1 + 63
_MAX_IMAGE = 1024
_MAX_MAIN_FILE = 4096
_MAX_ARGUMENT = 4096
_MAX_ARGUMENTS = 1000
_MAX_JOBS = 10_000
_MAX_SLOT_IDS = 10_000


def _storable(value: object) -> object:
    # Control characters and lone surrogates cannot be stored or sent back; say where they are.
    if isinstance(value, str):
        problem = text_problem(value)
        if problem is not None:
            raise ValueError(problem)
    return value


def _distinct(values: list[int]) -> list[int]:
    if len(set(values)) != len(values):
        raise ValueError("slot ids must be distinct")
    return values


_STORABLE = BeforeValidator(_storable)
_Name = Annotated[str, Field(min_length=1, max_length=_MAX_NAME, pattern=_NAME_PATTERN)]
_JobName = Annotated[str, Field(min_length=1, max_length=_MAX_JOB_NAME, pattern=_NAME_PATTERN)]
_LabelKey = Annotated[
    str, Field(min_length=1, max_length=_MAX_LABEL_KEY, pattern=_LABEL_KEY_PATTERN)
]
_Text = Annotated[str, _STORABLE, Field(min_length=1)]
_MAX_SLOT_ID = 1_000_000
_SlotIds = Annotated[
    list[Annotated[int, Field(ge=0, le=_MAX_SLOT_ID)]],
    Field(min_length=1, max_length=_MAX_SLOT_IDS),
    AfterValidator(_distinct),
]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SlotSizeBody(_Body):
    """The resources of one slot: every slot of a testbed has this size."""

    cpu_millis: int = Field(ge=1, le=1_000_000, description="milli-CPUs, e.g. 1000 = 1 CPU")
    memory_mib: int = Field(ge=1, le=64 * 1024 * 1024, description="MiB")


class TestbedBody(_Body):
    """A testbed: ``slots_per_node`` slots of ``slot`` size on every node labelled
    ``node_label``. Sent again with another shape, it resizes the testbed."""

    __test__ = False  # its name starts with Test; pytest must not collect it

    name: _Name
    node_label: _LabelKey = Field(description="a node label key; the nodes carrying it")
    slots_per_node: int = Field(ge=1, le=1000)
    slot: SlotSizeBody


class JobBody(_Body):
    """A batch job: a Spark or Flink application to run on slots a scheduling assigns."""

    name: _JobName
    kind: Literal["spark", "flink"]
    image: Annotated[_Text, Field(max_length=_MAX_IMAGE)]
    main_file: Annotated[
        _Text, Field(max_length=_MAX_MAIN_FILE, description="the jar or py file's URI")
    ]
    arguments: list[Annotated[str, _STORABLE, Field(max_length=_MAX_ARGUMENT)]] = Field(
        default_factory=list, max_length=_MAX_ARGUMENTS
    )


class SlotItemBody(_Body):
    """Slot-based strategies: run ``job`` on exactly these slots (one pod per slot)."""

    job: _JobName
    slot_ids: _SlotIds


class SchedulingBody(_Body):
    """A scheduling of jobs on a testbed. ``queue`` (strategy ``queue``): job names, a job named
    k times runs on k slots; ``items`` (``slots_strict`` / ``slots_relaxed``): jobs on given
    slots — strict starts them in order, relaxed starts any whose slots are free."""

    name: _Name
    testbed: _Name
    strategy: Literal["queue", "slots_strict", "slots_relaxed"]
    queue: list[_JobName] = Field(default_factory=list, max_length=_MAX_JOBS)
    items: list[SlotItemBody] = Field(default_factory=list, max_length=_MAX_JOBS)


class ExtensionBody(_Body):
    """More jobs for a running scheduling, in its strategy's form."""

    queue: list[_JobName] = Field(default_factory=list, max_length=_MAX_JOBS)
    items: list[SlotItemBody] = Field(default_factory=list, max_length=_MAX_JOBS)


_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body could not be read as JSON"},
    413: {"description": "the body is larger than the server's limit"},
    422: {"description": "the body does not validate, or names a job or testbed that is missing"},
    503: {"description": "the event log is unreachable; see Retry-After"},
}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {"description": "conflicts with what is recorded; detail.holder names the scheduling"}
}
_UNKNOWN: dict[int | str, dict[str, Any]] = {404: {"description": "no resource of that name"}}
_CREATED: dict[int | str, dict[str, Any]] = {
    201: {"description": "created; the answer says at which log position"},
    200: {"description": "it existed: changed (appended) or a repeat (nothing appended)"},
}

After = Annotated[
    int, Query(ge=0, le=2**63 - 1, description="a log position: items created after it")
]
Limit = Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE, description="items per page")]


def testbeds_router(runtime: TestbedsRuntime) -> APIRouter:
    """The external scheduler's endpoints and the watch websocket over ``runtime``."""
    router = APIRouter(tags=["testbeds"])
    _testbed_routes(router, runtime.service)
    _job_routes(router, runtime.service)
    _scheduling_routes(router, runtime)
    router.include_router(watch_router(runtime.store))
    return router


def _testbed_routes(router: APIRouter, service: TestbedsService) -> None:

    @router.post("/v1/testbeds", status_code=201, responses={**_CREATED, **_CONFLICT, **_ERRORS})
    def define_testbed(body: TestbedBody, response: Response) -> dict[str, Any]:
        """Create a testbed, or resize it."""
        with _translated():
            written = service.define_testbed(
                body.name,
                node_label=body.node_label,
                slots_per_node=body.slots_per_node,
                cpu_millis=body.slot.cpu_millis,
                memory_mib=body.slot.memory_mib,
            )
            view = _testbed_view(service, body.name)
        return _written(response, "testbed", written, view)

    @router.get("/v1/testbeds", responses=_ERRORS)
    def list_testbeds(after: After = 0, limit: Limit = DEFAULT_PAGE_SIZE) -> dict[str, Any]:
        """The testbeds, in the order they were created in the log."""
        return _page(
            service,
            "testbed",
            after,
            limit,
            lambda name: _testbed_view(service, name, catch_up=False),
        )

    @router.get("/v1/testbeds/{name}", responses={**_UNKNOWN, **_ERRORS})
    def get_testbed(name: str) -> dict[str, Any]:
        """One testbed: its definition, holder, slots and state."""
        with _translated():
            return _testbed_view(service, name)

    @router.delete("/v1/testbeds/{name}", responses={**_UNKNOWN, **_CONFLICT, **_ERRORS})
    def delete_testbed(name: str) -> dict[str, Any]:
        """Delete a testbed no scheduling holds."""
        with _translated():
            written = service.delete_testbed(name)
        return _deleted("testbed", name, written)


def _job_routes(router: APIRouter, service: TestbedsService) -> None:

    @router.post("/v1/jobs", status_code=201, responses={**_CREATED, **_CONFLICT, **_ERRORS})
    def define_job(body: JobBody, response: Response) -> dict[str, Any]:
        """Define a batch job; it is ready until a scheduling claims it."""
        with _translated():
            written = service.define_job(
                body.name,
                kind=body.kind,
                image=body.image,
                main_file=body.main_file,
                arguments=tuple(body.arguments),
            )
            view = _job_view(service, body.name)
        return _written(response, "job", written, view)

    @router.get("/v1/jobs", responses=_ERRORS)
    def list_jobs(after: After = 0, limit: Limit = DEFAULT_PAGE_SIZE) -> dict[str, Any]:
        """The jobs, in the order they were created in the log."""
        return _page(
            service, "job", after, limit, lambda name: _job_view(service, name, catch_up=False)
        )

    @router.get("/v1/jobs/{name}", responses={**_UNKNOWN, **_ERRORS})
    def get_job(name: str) -> dict[str, Any]:
        """One job: its status, holder, application and slots."""
        with _translated():
            return _job_view(service, name)

    @router.delete("/v1/jobs/{name}", responses={**_UNKNOWN, **_CONFLICT, **_ERRORS})
    def delete_job(name: str) -> dict[str, Any]:
        """Delete a job no scheduling holds."""
        with _translated():
            written = service.delete_job(name)
        return _deleted("job", name, written)


def _scheduling_routes(router: APIRouter, runtime: TestbedsRuntime) -> None:
    service = runtime.service

    @router.post("/v1/schedulings", status_code=201, responses={**_CREATED, **_CONFLICT, **_ERRORS})
    def create_scheduling(body: SchedulingBody, response: Response) -> dict[str, Any]:
        """Create a scheduling; the runtime claims its jobs and testbed and starts them."""
        _check_strategy(body.strategy, body.queue, body.items)
        with _translated():
            try:
                service.existing_testbed(body.testbed)
            except NotFound as e:
                raise _invalid(("body", "testbed"), e.reason) from e
            _check_jobs(service, body.name, body.queue, body.items)
            written = service.create_scheduling(
                body.name,
                testbed=body.testbed,
                mode=body.strategy,
                queue=tuple(body.queue),
                items=_items(body.items),
            )
            view = _scheduling_view(service, body.name)
        return _written(response, "scheduling", written, view)

    @router.post("/v1/schedulings/{name}/queue", responses={**_UNKNOWN, **_CONFLICT, **_ERRORS})
    def extend_scheduling(name: str, body: ExtensionBody) -> dict[str, Any]:
        """Give a running scheduling more jobs (online scheduling)."""
        with _translated():
            stream = service.existing_scheduling(name)
            created = stream.state.created
            assert created is not None  # an existing scheduling was created
            _check_strategy(created.mode, body.queue, body.items)
            _check_jobs(service, name, body.queue, body.items)
            written = service.extend_scheduling(
                name, queue=tuple(body.queue), items=_items(body.items)
            )
            view = _scheduling_view(service, name)
        return {"position": written.position, "appended": written.appended, "scheduling": view}

    @router.get("/v1/schedulings", responses=_ERRORS)
    def list_schedulings(after: After = 0, limit: Limit = DEFAULT_PAGE_SIZE) -> dict[str, Any]:
        """The schedulings, in the order they were created in the log."""
        return _page(
            service,
            "scheduling",
            after,
            limit,
            lambda name: _scheduling_view(service, name, catch_up=False),
        )

    @router.get("/v1/schedulings/{name}", responses={**_UNKNOWN, **_ERRORS})
    def get_scheduling(name: str) -> dict[str, Any]:
        """One scheduling: phase, queue left, assignments and its jobs."""
        with _translated():
            return _scheduling_view(service, name)

    @router.delete("/v1/schedulings/{name}", responses={**_UNKNOWN, **_ERRORS})
    def release_scheduling(name: str) -> dict[str, Any]:
        """Release a scheduling: its jobs and testbed go back; it is finished."""
        return _release(runtime, name)


# -- writing ---------------------------------------------------------------------------------------


def _release(runtime: TestbedsRuntime, name: str) -> dict[str, Any]:
    service = runtime.service
    with _translated():
        stream = service.existing_scheduling(name)
        appended = runtime.process.release(name, duty=False) > 0
        position = service.last_position(stream)
        view = _scheduling_view(service, name)
    return {"position": position, "appended": appended, "scheduling": view}


def _written(
    response: Response, kind: str, written: Written, view: dict[str, Any]
) -> dict[str, Any]:
    created = written.appended and view["created_position"] == written.position
    response.status_code = 201 if created else 200
    return {"position": written.position, "appended": written.appended, kind: view}


def _deleted(kind: str, name: str, written: Written) -> dict[str, Any]:
    return {
        "position": written.position,
        "appended": written.appended,
        kind: {"name": name, "deleted": True},
    }


def _items(items: Sequence[SlotItemBody]) -> tuple[SlotItem, ...]:
    return tuple(SlotItem(item.job, tuple(item.slot_ids)) for item in items)


def _check_strategy(strategy: str, queue: Sequence[str], items: Sequence[SlotItemBody]) -> None:
    if strategy == "queue" and items:
        raise _invalid(
            ("body", "items"), "strategy queue takes a queue of job names, not slot items"
        )
    if strategy != "queue" and queue:
        raise _invalid(("body", "queue"), f"strategy {strategy} takes slot items, not a queue")


def _check_jobs(
    service: TestbedsService,
    scheduling: str,
    queue: Sequence[str],
    items: Sequence[SlotItemBody],
) -> None:
    """A job that does not exist is a 422 at its place in the body; one another scheduling
    holds a 409 naming that scheduling."""
    named: list[tuple[tuple[str | int, ...], str]] = [
        (("body", "queue", i), job) for i, job in enumerate(queue)
    ]
    named += [(("body", "items", i, "job"), item.job) for i, item in enumerate(items)]
    checked: set[str] = set()
    for loc, job in named:
        if job in checked:
            continue
        checked.add(job)
        try:
            service.check_claimable(scheduling, job)
        except NotFound as e:
            raise _invalid(loc, e.reason) from e


def _invalid(loc: Sequence[str | int], message: str) -> RequestValidationError:
    return RequestValidationError([{"loc": tuple(loc), "msg": message, "type": "value_error"}])


@contextmanager
def _translated() -> Iterator[None]:
    """The testbeds' errors as the app answers them (see the module docstring)."""
    try:
        yield
    except InvalidTestbedCommand as e:
        raise _invalid(("body",), str(e)) from e
    except NotFound as e:
        raise HTTPException(404, e.reason) from e
    except Conflict as e:
        raise HTTPException(409, {"reason": e.reason, "holder": e.holder}) from e
    except CommandRejected as e:
        raise HTTPException(409, {"reason": e.reason, "holder": None}) from e
    except InvalidEvent as e:
        # The log refused a value the request carried: its fault, which is no outage.
        raise _invalid(("body",), f"the log refuses it: {e}") from e
    except LogUnavailable as e:
        if isinstance(e.__cause__, InvalidEvent):
            raise _invalid(("body",), f"the log refuses it: {e.__cause__}") from e
        raise _unavailable(f"the event log is unreachable: {e}", _LOG_RETRY_SECONDS) from e
    except EventStoreError as e:
        raise _unavailable(f"the event log is unreachable: {e}", _LOG_RETRY_SECONDS) from e
    except (LogContention, NotLeading) as e:
        raise _unavailable(str(e), 1) from e
    except TestbedsError as e:
        raise HTTPException(409, {"reason": str(e), "holder": None}) from e


def _unavailable(detail: str, retry_after: int) -> HTTPException:
    return HTTPException(503, detail, headers={"Retry-After": str(retry_after)})


# -- reading ---------------------------------------------------------------------------------------


def _page(
    service: TestbedsService,
    kind: Literal["testbed", "job", "scheduling"],
    after: int,
    limit: int,
    view: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    with _translated():
        names, next_after = service.listed(kind, after=after, limit=limit)
        items = []
        for name in names:
            try:
                items.append(view(name))
            except NotFound:
                continue  # deleted since the page was read: as if it had been before
    return {"items": items, "next_after": next_after}


def _positions(service: TestbedsService, kind: Any, name: str) -> dict[str, int]:
    created, latest = service.position_of(kind, name)
    return {"created_position": created, "position": latest}


def _testbed_view(service: TestbedsService, name: str, *, catch_up: bool = True) -> dict[str, Any]:
    state: TestbedState = service.existing_testbed(name, catch_up=catch_up).state
    defined = state.defined
    assert defined is not None  # an existing testbed is defined
    return {
        "name": defined.name,
        "node_label": defined.node_label,
        "slots_per_node": defined.slots_per_node,
        "slot": {"cpu_millis": defined.cpu_millis, "memory_mib": defined.memory_mib},
        "holder": state.holder,
        "state": overall_state(state),
        "problems": list(state.problems),
        "nodes": [
            {"name": n.name, "cpu_millis": n.cpu_millis, "memory_mib": n.memory_mib}
            for n in state.nodes
        ],
        "slots": [
            {
                "id": slot.slot_id,
                "node": slot.node,
                "position_on_node": slot.position_on_node,
                "status": slot.status,
                "pod": slot.reserved_for,
                "ghost_pod": None if slot.ghost_pod is None else slot.ghost_pod.name,
            }
            for slot in slots(state)
        ],
        "observed_at": _time(state.observed_at),
        **_positions(service, "testbed", name),
    }


def _job_view(service: TestbedsService, name: str, *, catch_up: bool = True) -> dict[str, Any]:
    state: JobState = service.existing_job(name, catch_up=catch_up).state
    defined = state.defined
    assert defined is not None  # an existing job is defined
    requested = state.application
    return {
        "name": defined.name,
        "kind": defined.kind,
        "image": defined.image,
        "main_file": defined.main_file,
        "arguments": list(defined.arguments),
        "status": state.status,
        "holder": state.holder,
        "application": None if requested is None else application_name(defined.name),
        "testbed": None if requested is None else requested.request.testbed,
        "slots": [] if requested is None else list(requested.request.slot_ids),
        "nodes": [] if requested is None else list(requested.request.nodes),
        "deleting_application": state.deleting_application,
        "started_at": _time(state.started_at),
        "completed_at": _time(state.completed_at),
        "message": state.message,
        "runs": [
            {
                "scheduling": run.scheduling,
                "slots": list(run.slot_ids),
                "requested_at": _time(run.requested_at),
                "started_at": _time(run.started_at),
                "completed_at": _time(run.completed_at),
                "outcome": run.outcome,
                "message": run.message,
            }
            for run in state.runs
        ],
        **_positions(service, "job", name),
    }


def _scheduling_view(
    service: TestbedsService, name: str, *, catch_up: bool = True
) -> dict[str, Any]:
    state: SchedulingState = service.existing_scheduling(name, catch_up=catch_up).state
    created = state.created
    assert created is not None  # an existing scheduling was created
    conflict = state.last_conflict
    return {
        "name": created.name,
        "testbed": created.testbed,
        "strategy": created.mode,
        "phase": state.phase,
        "queue": list(state.queue),
        "items": [{"job": i.job, "slot_ids": list(i.slot_ids)} for i in state.items],
        "assignments": [{"job": a.job, "slot_ids": list(a.slot_ids)} for a in state.assignments],
        "jobs": [_job_status(service, job, state) for job in state.jobs],
        "holds_testbed": state.holds_testbed,
        "last_conflict": None
        if conflict is None
        else {"resource": conflict.resource, "reason": conflict.reason, "at": _time(conflict.at)},
        **_positions(service, "scheduling", name),
    }


def _job_status(service: TestbedsService, job: str, state: SchedulingState) -> dict[str, Any]:
    try:
        status: str | None = service.existing_job(job, catch_up=False).state.status
    except NotFound:
        status = None  # not defined (yet), or deleted: the scheduling waits for it
    return {"name": job, "status": status, "held": job in state.held_jobs}


def _time(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()
