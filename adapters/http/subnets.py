"""The HTTP API of subnets (FastAPI router): how each subnet's pod IPs are shared out.

=========================================  =====================================================
``GET /v1/subnets/{subnet_id}``            capacity, node count, IPs used, the batch size with
                                           the inputs of its last change, the exhaustion flag
                                           and every node's pool
=========================================  =====================================================

``404`` for a subnet never created, ``503`` (with ``Retry-After``) while the runtime is not
running or the log is unreachable. Reads come from the runtime's read model
(:mod:`fleetledger.projections.subnets`), caught up with the log first, so a read right after a
command sees it.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from fleetledger.adapters.ipam import IpamRuntime
from fleetledger.eventstore import EventStoreError

__all__ = ["subnets_router"]


def subnets_router(runtime: IpamRuntime) -> APIRouter:
    """The subnet routes over ``runtime`` (which the app starts and stops)."""
    router = APIRouter(tags=["subnets"])

    @router.get("/v1/subnets/{subnet_id}", response_model=None)
    def get_subnet(subnet_id: str) -> JSONResponse | dict[str, object]:
        """One subnet and its per-node pools."""
        if not runtime.running:
            return _error(503, "the controller is not running; try again shortly", retry_after=1)
        try:
            runtime.projection.catch_up(runtime.store)
        except EventStoreError as e:
            return _error(503, f"the event log is unreachable: {e}", retry_after=5)
        view = runtime.projection.view(subnet_id)
        if view is None:
            return _error(404, f"no subnet {subnet_id!r}; subnets are created by the controller")
        return view

    return router


def _error(status_code: int, detail: str, *, retry_after: int | None = None) -> JSONResponse:
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return JSONResponse({"detail": detail}, status_code=status_code, headers=headers)
