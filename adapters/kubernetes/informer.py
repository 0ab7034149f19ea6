"""An informer: a local cache of one kind of object, kept by list + watch with resource versions.

:meth:`Informer.relist` lists every object and remembers the list's ``resourceVersion``;
:meth:`Informer.watch` then streams the changes after it (``ADDED``/``MODIFIED``/``DELETED``,
bookmarks), moving the version with each event, until the server ends the stream. When the
version is too old for the server (``410 Gone``, as a status or as an ``ERROR`` event, once etcd
has compacted it), the informer lists again: the cache then holds exactly what the list showed.
:meth:`Informer.run` repeats watch rounds until stopped — client-go's reflector, without its
queue.

Objects are cached by ``namespace/name``, or by name for a cluster-scoped kind (client-go's
``MetaNamespaceKeyFunc``): the same pod name in two namespaces is two entries.

**Order.** An event changes the cache only if it is newer than what the cache holds: newer than
the last list, newer than the cached object under its key, and newer than the deletion of its uid
if that was seen. A duplicate or late event (a watch resumed from an older version, a change
replayed by a proxy) is dropped, and a ``DELETED`` for a pod's uid never removes a newer pod that
took the name. Resource versions are opaque to clients by the API's conventions, yet the API
server derives them from etcd's revision, an integer that only grows; so they are compared as
integers, and an event whose version is not one is applied as it comes.

**Stalls.** A watch whose connection stops delivering without being closed (a hung proxy, a lost
NAT entry: no RST, no data) would block for good; every watch therefore carries a client-side
read timeout (``_request_timeout``) a grace period beyond the server's ``timeoutSeconds``, by
which a healthy watch has ended, and the informer lists again when it fires.

**Staleness.** :meth:`Informer.staleness_seconds` is the time since the API server was last
heard from — an event, a bookmark, a successful list, or a watch the server ended cleanly (which
tells that nothing else changed until then), on the injected ``clock``.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ReadTimeoutError

__all__ = ["Informer", "object_key"]

log = structlog.get_logger(__name__)

T = TypeVar("T")
_GONE = 410
_CONNECT_TIMEOUT_SECONDS = 10.0
_TOMBSTONES = 65_536
"""Deleted uids remembered between lists (oldest forgotten first), to drop a late replay."""
_new_watch: Callable[[], Any] = watch.Watch


def object_key(metadata: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object, the name of a cluster-scoped one."""
    namespace = metadata.get("namespace")
    return f"{namespace}/{metadata['name']}" if namespace else str(metadata["name"])


@dataclass(frozen=True, slots=True)
class _Held(Generic[T]):
    uid: str
    version: int | None
    obj: T


class Informer(Generic[T]):
    """Objects of one kind by key, converted by ``convert`` from their JSON; thread-safe.

    ``list_call`` is the client's list function (``CoreV1Api.list_node``); it is called with
    ``_preload_content=False`` for lists, and through :class:`kubernetes.watch.Watch` for watches.
    ``watch_seconds`` is the server's timeout for a watch; ``read_grace_seconds`` how much longer
    the client waits for a byte before it deems the connection stalled; ``list_timeout_seconds``
    the read timeout of a list. ``clock`` (seconds, monotonic) times staleness.
    """

    def __init__(
        self,
        list_call: Callable[..., Any],
        convert: Callable[[Mapping[str, Any]], T],
        *,
        kind: str,
        watch_seconds: int = 60,
        read_grace_seconds: float = 15.0,
        list_timeout_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if watch_seconds < 1:
            raise ValueError(f"watch_seconds must be at least 1, not {watch_seconds}")
        if read_grace_seconds <= 0 or list_timeout_seconds <= 0:
            raise ValueError(
                "read_grace_seconds and list_timeout_seconds must be positive, not "
                f"{read_grace_seconds} and {list_timeout_seconds}"
            )
        self._list = list_call
        self._convert = convert
        self.kind = kind
        self._watch_seconds = watch_seconds
        self._read_grace = read_grace_seconds
        self._list_timeout = list_timeout_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, _Held[T]] = {}
        self._resource_version: str | None = None
        self._listed: int | None = None
        self._deleted: OrderedDict[str, int | None] = OrderedDict()
        self._heard = clock()
        self.relists = 0
        """How many full lists were made (the first one included)."""
        self.stalls = 0
        """How many watches hit the read timeout."""
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
        """The cached objects, sorted by key."""
        with self._lock:
            return [self._items[key].obj for key in sorted(self._items)]

    def get(self, key: str) -> T | None:
        """The cached object of ``key`` (see :func:`object_key`), or ``None``."""
        with self._lock:
            held = self._items.get(key)
            return held.obj if held is not None else None

    def staleness_seconds(self) -> float:
        """Seconds since the API server was last heard from (since creation if never)."""
        with self._lock:
            return max(0.0, self._clock() - self._heard)

    def relist(self) -> None:
        """Replace the cache with a full list and remember its resource version."""
        response = self._list(
            _preload_content=False,
            _request_timeout=(_CONNECT_TIMEOUT_SECONDS, self._list_timeout),
        )
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        items: dict[str, _Held[T]] = {}
        for item in body.get("items") or ():
            metadata = item.get("metadata") or {}
            items[object_key(metadata)] = _Held(
                str(metadata.get("uid") or ""), _version(metadata), self._convert(item)
            )
        version = str((body.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            self._items = items
            self._resource_version = version
            self._listed = _as_int(version)
            self._deleted.clear()
            self._heard = self._clock()
            self.relists += 1
        log.debug("listed", kind=self.kind, items=len(items), version=version)

    def watch(self, *, timeout_seconds: int | None = None) -> int:
        """Apply the changes after the cache's version until the server ends the stream; list
        first if the cache never was, or again on ``410 Gone`` or a stalled connection. Returns
        the events that changed the cache."""
        if not self.synced:
            self.relist()
        seconds = timeout_seconds or self._watch_seconds
        applied = 0
        stream = _new_watch()
        self._watch = stream
        try:
            for event in stream.stream(
                self._list,
                resource_version=self.resource_version,
                timeout_seconds=seconds,
                allow_watch_bookmarks=True,
                _request_timeout=(_CONNECT_TIMEOUT_SECONDS, seconds + self._read_grace),
            ):
                applied += self._apply(event)
        except ApiException as e:
            if e.status != _GONE:
                raise
            log.info("watch version expired; listing again", kind=self.kind, reason=e.reason)
            self.relist()
        except (ReadTimeoutError, MaxRetryError) as e:
            # A stall before the response's headers comes back through the client's retries.
            if isinstance(e, MaxRetryError) and not isinstance(e.reason, ReadTimeoutError):
                raise
            self.stalls += 1
            log.warning(
                "watch stalled; listing again",
                kind=self.kind,
                silent_seconds=seconds + self._read_grace,
            )
            self.relist()
        else:
            self._touch()
        finally:
            self._watch = None
        return applied

    def observe(self, raw: Mapping[str, Any]) -> bool:
        """Apply an object just read from the API (a ``GET`` after a conflict) as a
        ``MODIFIED`` would be, if it is newer than the cache's; returns whether it changed the
        cache."""
        return self._apply({"type": "MODIFIED", "raw_object": raw}) == 1

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
        """End :meth:`run` (the watch in progress is closed at once)."""
        self._stop.set()
        stream = self._watch
        if stream is not None:
            stream.stop()

    def _touch(self) -> None:
        with self._lock:
            self._heard = self._clock()

    def _apply(self, event: Mapping[str, Any]) -> int:
        change = event.get("type")
        raw = event.get("raw_object") or {}
        metadata = raw.get("metadata") or {}
        version = _version(metadata)
        with self._lock:
            self._heard = self._clock()
            if change not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                return 0
            if metadata.get("resourceVersion") and _newer(version, _as_int(self._resource_version)):
                self._resource_version = str(metadata["resourceVersion"])
            if change == "BOOKMARK" or not _newer(version, self._listed):
                return 0
            key = object_key(metadata)
            uid = str(metadata.get("uid") or "")
            if uid in self._deleted and not _newer(version, self._deleted[uid]):
                return 0
            held = self._items.get(key)
            if change == "DELETED":
                self._forget(uid, version)
                if held is None or (uid and held.uid and held.uid != uid):
                    return 0
                if not _newer(version, held.version):
                    return 0
                del self._items[key]
                return 1
            if held is not None and not _newer(version, held.version):
                return 0
            self._items[key] = _Held(uid, version, self._convert(raw))
            return 1

    def _forget(self, uid: str, version: int | None) -> None:
        if not uid:
            return
        self._deleted[uid] = version
        self._deleted.move_to_end(uid)
        while len(self._deleted) > _TOMBSTONES:
            self._deleted.popitem(last=False)


def _version(metadata: Mapping[str, Any]) -> int | None:
    return _as_int(metadata.get("resourceVersion"))


def _as_int(version: object) -> int | None:
    text = str(version) if version is not None else ""
    return int(text) if text.isdigit() else None


def _newer(version: int | None, than: int | None) -> bool:
    """Whether ``version`` comes after ``than``; unknown either way counts as newer, so a
    server whose versions are not integers is followed as it speaks."""
    return version is None or than is None or version > than
