"""An informer: a local cache of one kind of object, kept by list + watch with resource versions.

:meth:`Informer.relist` lists every object and remembers the list's ``resourceVersion``;
:meth:`Informer.watch` then streams the changes after it (``ADDED``/``MODIFIED``/``DELETED``,
bookmarks), moving the version with each event, until the server ends the stream. When the
version is too old for the server (``410 Gone``, as a status or as an ``ERROR`` event, once etcd
has compacted it), the informer lists again: the cache then holds exactly what the list showed.
:meth:`Informer.run` repeats watch rounds until stopped — client-go's reflector, without its
queue.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import structlog
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

__all__ = ["Informer"]

log = structlog.get_logger(__name__)

T = TypeVar("T")
_GONE = 410
_new_watch: Callable[[], Any] = watch.Watch


class Informer(Generic[T]):
    """Objects of one kind by name, converted by ``convert`` from their JSON; thread-safe.

    ``list_call`` is the client's list function (``CoreV1Api.list_node``); it is called with
    ``_preload_content=False`` for lists, and through :class:`kubernetes.watch.Watch` for watches.
    """

    def __init__(
        self,
        list_call: Callable[..., Any],
        convert: Callable[[Mapping[str, Any]], T],
        *,
        kind: str,
        watch_seconds: int = 300,
    ) -> None:
        self._list = list_call
        self._convert = convert
        self.kind = kind
        self._watch_seconds = watch_seconds
        self._lock = threading.Lock()
        self._items: dict[str, T] = {}
        self._resource_version: str | None = None
        self.relists = 0
        """How many full lists were made (the first one included)."""
        self._watch: Any = None
        self._stop = threading.Event()

    @property
    def resource_version(self) -> str | None:
        with self._lock:
            return self._resource_version

    @property
    def synced(self) -> bool:
        """Whether a list has filled the cache."""
        return self.resource_version is not None

    def items(self) -> list[T]:
        """The cached objects, sorted by name."""
        with self._lock:
            return [self._items[name] for name in sorted(self._items)]

    def relist(self) -> None:
        """Replace the cache with a full list and remember its resource version."""
        response = self._list(_preload_content=False)
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        items = {item["metadata"]["name"]: self._convert(item) for item in body.get("items") or ()}
        with self._lock:
            self._items = items
            self._resource_version = str((body.get("metadata") or {}).get("resourceVersion", ""))
            self.relists += 1
        log.debug("listed", kind=self.kind, items=len(items), version=self._resource_version)

    def watch(self, *, timeout_seconds: int | None = None) -> int:
        """Apply the changes after the cache's version until the server ends the stream; list
        first if the cache never was, or again on ``410 Gone``. Returns the events applied."""
        if not self.synced:
            self.relist()
        applied = 0
        stream = _new_watch()
        self._watch = stream
        try:
            for event in stream.stream(
                self._list,
                resource_version=self.resource_version,
                timeout_seconds=timeout_seconds or self._watch_seconds,
                allow_watch_bookmarks=True,
            ):
                applied += self._apply(event)
        except ApiException as e:
            if e.status != _GONE:
                raise
            log.info("watch version expired; listing again", kind=self.kind, reason=e.reason)
            self.relist()
        finally:
            self._watch = None
        return applied

    def run(self) -> None:
        """Watch rounds until :meth:`stop`; a failed round is logged and retried after a pause."""
        self._stop.clear()
        while not self._stop.is_set():
            try:
                self.watch()
            except Exception as e:
                log.warning("watch failed; retrying", kind=self.kind, error=str(e))
                self._stop.wait(1.0)

    def stop(self) -> None:
        """End :meth:`run` (the watch in progress is closed at its next event or timeout)."""
        self._stop.set()
        stream = self._watch
        if stream is not None:
            stream.stop()

    def _apply(self, event: Mapping[str, Any]) -> int:
        kind = event.get("type")
        raw = event.get("raw_object") or {}
        metadata = raw.get("metadata") or {}
        version = metadata.get("resourceVersion")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._items[metadata["name"]] = self._convert(raw)
            elif kind == "DELETED":
                self._items.pop(metadata["name"], None)
            elif kind != "BOOKMARK":
                return 0
            if version:
                self._resource_version = str(version)
        return 0 if kind == "BOOKMARK" else 1
