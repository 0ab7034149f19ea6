"""The leader lease as a Kubernetes ``Lease`` (``coordination.k8s.io/v1``), as client-go elects.

An alternative to the database's lease for replicas in a cluster: the same
:class:`~fleetledger.adapters.runtime.leadership.Lease` port, so :class:`Leadership` still records
every term in the log and the store still fences deposed terms; only who may campaign comes from
the API server. The semantics are client-go's ``leaderelection`` (``tryAcquireOrRenew``):

- the Lease's ``spec`` is the election record: ``holderIdentity``, ``leaseDurationSeconds``,
  ``acquireTime`` (when the holder took it), ``renewTime`` (its last renewal) and
  ``leaseTransitions`` (how many times it changed hands);
- a candidate creates the Lease if there is none (``409 AlreadyExists``: another did first);
- it takes a held Lease over only once it has expired: ``renewTime + leaseDurationSeconds`` has
  passed *and*, as client-go measures it, the record has not changed for
  ``leaseDurationSeconds`` of this process's own monotonic clock since it first saw it — so
  neither a skewed wall clock here nor one at the holder hands the lease over early;
- taking over sets a new ``acquireTime`` and adds one to ``leaseTransitions``; renewing moves
  ``renewTime`` only;
- every write is a replace carrying the ``resourceVersion`` read: two candidates racing for an
  expired Lease both send one, the API server accepts the first and answers the other
  ``409 Conflict`` — the loser does not lead;
- releasing clears ``holderIdentity`` (``leaseDurationSeconds`` 1), so the next candidate need
  not wait out the lease.

A renewal the API server does not answer, or answers with an error, is a lost lease (the process
steps down; :class:`Leadership` campaigns again). ``leaseDurationSeconds`` is the lease rounded up
to whole seconds, so candidates never wait less than the holder's acting deadline assumes.

Names are checked as the API server would: a Lease name is a DNS subdomain, a namespace a DNS
label; :func:`pod_namespace` is the pod's own namespace, from its service account.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from fleetledger.adapters.clock import Clock, SystemClock

from .status import status_message

__all__ = [
    "DEFAULT_LEASE_NAME",
    "SERVICE_ACCOUNT_NAMESPACE",
    "KubernetesLease",
    "LeaseRecord",
    "check_lease_name",
    "check_namespace",
    "pod_namespace",
]

log = structlog.get_logger(__name__)

DEFAULT_LEASE_NAME = "fleetledger"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
"""Where a pod finds its own namespace (mounted with its service account token)."""

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_lease_name(name: str) -> str:
    """``name`` if the API server takes it as a Lease's name (a DNS subdomain); else
    ``ValueError`` saying what it must be."""
    if len(name) > 253 or _DNS_SUBDOMAIN.match(name) is None:
        raise ValueError(
            f"--lease-name must be a Kubernetes object name (lower-case letters, digits, '-' and "
            f"'.', starting and ending with a letter or digit, at most 253), not {name!r}"
        )
    return name


def check_namespace(namespace: str) -> str:
    """``namespace`` if it is a namespace name (a DNS label); else ``ValueError``."""
    if _DNS_LABEL.match(namespace) is None:
        raise ValueError(
            f"--lease-namespace must be a Kubernetes namespace name (lower-case letters, digits "
            f"and '-', at most 63), not {namespace!r}"
        )
    return namespace


def pod_namespace(path: Path = SERVICE_ACCOUNT_NAMESPACE) -> str:
    """The namespace this pod runs in (its service account's), else ``default``."""
    try:
        namespace = path.read_text().strip()
    except OSError:
        return "default"
    return namespace or "default"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election record of a Lease as read, with the version a replace must carry."""

    holder: str
    duration_seconds: int
    acquire_time: datetime | None
    renew_time: datetime | None
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=spec.get("holderIdentity") or "",
            duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=_parse_time(spec.get("acquireTime")),
            renew_time=_parse_time(spec.get("renewTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


class KubernetesLease:
    """The leader lease as the Lease ``namespace/name``, held as ``holder``; thread-safe."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str,
        namespace: str,
        holder: str,
        lease_seconds: float = 10.0,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not lease_seconds >= 1:
            raise ValueError(f"lease_seconds must be at least 1, got {lease_seconds}")
        if not holder:
            raise ValueError("holder must name this process (e.g. host:pid)")
        self._api = client.CoordinationV1Api(api_client)
        self.name = check_lease_name(name)
        self.namespace = check_namespace(namespace)
        self.holder = holder
        self._duration = math.ceil(lease_seconds)
        # An answer later than this is no answer: the renewal must not outlast the lease.
        self._timeout = max(0.5, lease_seconds / 2)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._held: LeaseRecord | None = None
        # The record as last seen, and when (monotonic) it was first seen so: client-go's
        # observedTime, which expiry is measured from.
        self._observed: tuple[LeaseRecord, float] | None = None

    # -- the Lease port ----------------------------------------------------------------------

    def try_acquire(self) -> bool:
        with self._lock:
            if self._held is not None:
                return True
            try:
                current = self._read()
                now = self._clock.now()
                if current is None:
                    self._held = self._create(now)
                    return True
                self._observe(current)
                if current.holder and current.holder != self.holder and not self._expired(now):
                    return False
                if current.holder == self.holder:
                    # Ours already (this process, restarted under the same identity): renew.
                    self._held = self._replace(current, now, taking_over=False)
                else:
                    self._held = self._replace(current, now, taking_over=True)
                return True
            except _Lost as e:
                log.info("did not take the leader lease", lease=self._where(), reason=str(e))
                return False

    def check(self) -> bool:
        with self._lock:
            held = self._held
            if held is None:
                return False
            try:
                current = self._read()
                if current is None or current.holder != self.holder:
                    raise _Lost("the Lease names another holder or is gone")
                self._held = self._replace(current, self._clock.now(), taking_over=False)
                return True
            except _Lost as e:
                log.warning("lost the leader lease", lease=self._where(), reason=str(e))
                self._held = None
                return False

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            if held is None:
                return
            try:
                current = self._read()
                if current is None or current.holder != self.holder:
                    return
                self._write(current, self._released_spec(current))
            except _Lost as e:
                # Not released: the next candidate waits the lease out instead.
                log.info("could not release the leader lease", lease=self._where(), reason=str(e))

    # -- the record ----------------------------------------------------------------------------

    def record(self) -> LeaseRecord | None:
        """The Lease's election record as the API server has it now (``None``: no Lease)."""
        with self._lock:
            return self._read()

    def _observe(self, current: LeaseRecord) -> None:
        if self._observed is None or self._observed[0] != current:
            self._observed = (current, self._monotonic())

    def _expired(self, now: datetime) -> bool:
        assert self._observed is not None
        record, seen_at = self._observed
        duration = record.duration_seconds
        renewed = record.renew_time
        wall = renewed is None or renewed + timedelta(seconds=duration) <= now
        return wall and self._monotonic() - seen_at >= duration

    # -- the API -------------------------------------------------------------------------------

    def _read(self) -> LeaseRecord | None:
        try:
            response: Any = self._api.read_namespaced_lease(
                self.name, self.namespace, _preload_content=False, _request_timeout=self._timeout
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise _Lost(f"cannot read the Lease: {e.status} {status_message(e)}") from e
        except (HTTPError, OSError) as e:
            raise _Lost(f"cannot read the Lease: {e}") from e
        return LeaseRecord.of(json.loads(response.data))

    def _create(self, now: datetime) -> LeaseRecord:
        spec = self._holder_spec(now, acquired=now, transitions=0)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": spec,
        }
        try:
            response: Any = self._api.create_namespaced_lease(
                self.namespace,
                cast(Any, body),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as e:
            if e.status == 409:
                raise _Lost("another candidate created the Lease first") from e
            raise _Lost(f"cannot create the Lease: {e.status} {status_message(e)}") from e
        except (HTTPError, OSError) as e:
            raise _Lost(f"cannot create the Lease: {e}") from e
        log.info("created the leader Lease", lease=self._where(), holder=self.holder)
        return LeaseRecord.of(json.loads(response.data))

    def _replace(self, current: LeaseRecord, now: datetime, *, taking_over: bool) -> LeaseRecord:
        if taking_over:
            spec = self._holder_spec(now, acquired=now, transitions=current.transitions + 1)
        else:
            spec = self._holder_spec(
                now, acquired=current.acquire_time or now, transitions=current.transitions
            )
        written = self._write(current, spec)
        if taking_over:
            log.info(
                "took the leader Lease over",
                lease=self._where(),
                holder=self.holder,
                previous=current.holder or None,
                transitions=written.transitions,
            )
        return written

    def _write(self, current: LeaseRecord, spec: dict[str, Any]) -> LeaseRecord:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": current.resource_version,
            },
            "spec": spec,
        }
        try:
            response: Any = self._api.replace_namespaced_lease(
                self.name,
                self.namespace,
                cast(Any, body),
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as e:
            if e.status == 409:
                raise _Lost("another candidate wrote the Lease first (409 Conflict)") from e
            raise _Lost(f"cannot write the Lease: {e.status} {status_message(e)}") from e
        except (HTTPError, OSError) as e:
            raise _Lost(f"cannot write the Lease: {e}") from e
        return LeaseRecord.of(json.loads(response.data))

    def _holder_spec(
        self, now: datetime, *, acquired: datetime, transitions: int
    ) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self._duration,
            "acquireTime": _micro_time(acquired),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def _released_spec(self, current: LeaseRecord) -> dict[str, Any]:
        now = _micro_time(self._clock.now())
        # client-go's release: no holder, the shortest duration, the transitions kept.
        return {
            "leaseDurationSeconds": 1,
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": current.transitions,
        }

    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"


class _Lost(Exception):
    """The lease was not taken or renewed (refused, raced, or the API did not answer)."""


def _micro_time(at: datetime) -> str:
    """A ``MicroTime`` as the API serialises it: RFC 3339, microseconds, UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
