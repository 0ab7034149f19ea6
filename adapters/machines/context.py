"""Per-call context, the seed's ``context.Context`` utilities in Python's ``contextvars``.

Seed 01 ("Context Utilities") passes two things down the call stack instead of through every
signature: a *skip batching* flag set by a caller (retries, urgent requests, tests) and, inside the
coordinator, the *batch metadata* of the cloud call being made, so code below the port (an HTTP
policy, a log processor) can tell a batched call from a direct one. Context variables follow
threads started with ``contextvars.copy_context`` and asyncio tasks, like Go's context does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

__all__ = [
    "BatchMetadata",
    "batch_metadata",
    "current_batch",
    "should_skip_batching",
    "skip_batching",
]

_SKIP: ContextVar[bool] = ContextVar("fleetledger_skip_batching", default=False)
_BATCH: ContextVar[BatchMetadata | None] = ContextVar("fleetledger_batch", default=None)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchMetadata:
    """The batch a cloud call belongs to (the seed's ``BatchMetadata``)."""

    batch_id: str
    machine_names: tuple[str, ...]
    attempt: int

    @property
    def is_batched(self) -> bool:
        return len(self.machine_names) > 1


@contextmanager
def skip_batching(enabled: bool = True) -> Iterator[None]:
    """Requests enqueued inside this block get their own batch, sealed at once.

    ``with skip_batching(): machines.enqueue(...)`` is the seed's ``WithSkipBatching(ctx)``; an
    explicit ``skip_batching=`` on the request wins over the context.
    """
    token = _SKIP.set(enabled)
    try:
        yield
    finally:
        _SKIP.reset(token)


def should_skip_batching() -> bool:
    """Whether the current context asks for requests to skip batching."""
    return _SKIP.get()


@contextmanager
def batch_metadata(metadata: BatchMetadata) -> Iterator[None]:
    """Mark the cloud call made inside this block as belonging to ``metadata``'s batch."""
    token = _BATCH.set(metadata)
    try:
        yield
    finally:
        _BATCH.reset(token)


def current_batch() -> BatchMetadata | None:
    """The batch of the cloud call in progress, or ``None`` outside the coordinator."""
    return _BATCH.get()
