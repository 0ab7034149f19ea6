"""A scriptable fake of the Azure Resource Manager APIs the cloud adapters call, on loopback HTTPS.

The real SDK clients talk to it unchanged: it serves TLS with a self-signed certificate made at
start-up, so azure-core's bearer-token policy (which refuses plain ``http://``) is satisfied
without weakening the client, and the client verifies the certificate through
``connection_verify=<ca_bundle>`` instead of turning verification off. See
:meth:`FakeArmServer.client_options` and :class:`StaticTokenCredential`.

Served resources (one server per test; machine names are shared across the two APIs):

- ``Microsoft.Compute/virtualMachines/{name}`` — PUT (create-only with ``If-None-Match: *`` →
  412 when the VM exists), GET (``$expand=instanceView`` adds the provisioning status), DELETE;
- ``Microsoft.ContainerService/managedClusters/{c}/agentPools/{p}`` — GET (the pool's ``mode``);
  ``…/agentPools/{p}/deleteMachines`` — POST;
- ``…/agentPools/{p}/machines/{name}`` — PUT of a whole batch listed in the ``BatchPutMachine``
  header, GET of one machine;
- ``…/agentPools/{p}/machines`` — GET of the pool's machines, paged as the SDK's
  ``machines.list`` reads them (azure-mgmt-containerservice ``MachinesOperations.list``: an
  ``ItemPaged`` over ``{"value": [...], "nextLink": ...}`` pages; it follows ``nextLink`` with
  the link's own query plus the client's ``api-version``). Pages hold ``list_page_size``
  machines; each listing is a snapshot taken at its first page, so its later pages never shift;
- ``…/locations/{loc}/operations/{id}`` — the ``Azure-AsyncOperation`` status of a create.

The AKS batch PUT answers as the service does (the contract of the AKS machines batch API, as the
Karpenter Azure provider's design for header batching records it):

- in batch mode (a ``BatchPutMachine`` header is present) the body is the shared template only:
  its ``zones`` and ``properties.tags`` are *discarded*, and each machine gets exactly the
  ``zones`` (a list of strings) and ``tags`` (a string-to-string object) of its own
  ``batchMachines[]`` entry, nothing merged from the body. Without the header, the body's zones
  and tags are the one machine's. Sources: ``designs/0010-aks-machines-batch-creation.md`` in
  github.com/Azure/karpenter-provider-azure ("Zone/Tags fields in the shared body will be
  discarded"; the machine table there takes each machine's tags and zone from its header entry),
  the same repository's ``pkg/providers/azclient/aksmachinesheaderbatch/header.go`` (a
  ``MachineEntry`` is ``machineName`` string, ``zones`` []string, ``tags`` map[string]string),
  ``…/aksmachinesheaderbatch/batchkey.go`` (``buildSharedAKSMachineTemplate`` nils the body's
  tags and drops the top-level zones before the PUT) and ``pkg/fake/aksmachinesapi.go``
  (``createOneBatchMachine`` applies each entry's zones and tags to its machine); and
  azure-mgmt-containerservice's ``Machine`` model (``zones`` on the machine, ``tags`` on its
  ``MachineProperties``), which is the body's shape;
- every machine of the header must carry a ``fleetledger-request`` tag (the controller's rule, not
  the service's: a machine that cannot be traced to its request is a bug), else the batch is
  refused as a whole with ``400 MissingRequestTag``;
- every machine that could be started is started before the answer is written;
- a machine that cannot be (it already exists, or a script refuses it) is reported in a *flat*
  error body, without the ``error`` wrapper: ``400 BatchMachineClientError`` with one
  ``details[]`` entry per failed machine (``target`` is its name) if any failure is the client's,
  else ``500 BatchMachineInternalServerError`` whose ``message`` is the JSON text
  ``{"details": [...]}``. Started machines are not listed;
- a refusal of the batch as a whole (quota, a bad template, a bad header) is an ordinary ARM
  error body and starts nothing;
- all started: ``201`` with an ``Azure-AsyncOperation`` that covers only the machine the URL
  names. Every other machine's progress is read with its own GET, which reports ``Creating``
  ``polls_before_done`` times, then the outcome. A list is a read too: every machine it shows
  moves on as its own GET would move it;
- a machine's ``provisioningState`` is one of the preview ``Machine`` model's states:
  ``Creating``, ``Succeeded``, ``Failed`` (with ``status.provisioningError``) and ``Deleting``
  (a machine being deleted under its create, scripted with
  :meth:`~FakeArmServer.delete_while_creating`; it stays ``Deleting``);
- GETs are shaped by the API version asked for: a stable (non ``-preview``) version has no
  ``provisioningState`` and no ``status``, and only a preview version can create machines.

VM creates answer ``201`` with ``Azure-AsyncOperation``/``Location`` and ``Retry-After: 0``; the
operation reports ``InProgress`` ``polls_before_done`` times, then the outcome.

Scripts: :meth:`~FakeArmServer.set_quota`, :meth:`~FakeArmServer.gate_puts`,
:meth:`~FakeArmServer.set_agent_pool`, and, each consumed once,
:meth:`~FakeArmServer.fail_async`, :meth:`~FakeArmServer.refuse_machine`,
:meth:`~FakeArmServer.lose_response`, :meth:`~FakeArmServer.drop_next_puts`,
:meth:`~FakeArmServer.break_next_polls`, :meth:`~FakeArmServer.throttle`,
:meth:`~FakeArmServer.fail_next_puts`, :meth:`~FakeArmServer.fail_next_puts_after_handling`,
:meth:`~FakeArmServer.delete_while_creating`, :meth:`~FakeArmServer.break_next_lists`;
:meth:`~FakeArmServer.hide_from_lists` leaves a
machine out of the next lists. A machine whose answer is lost (:meth:`~FakeArmServer.lose_response`)
is left out of lists until its failing read has been answered.
:meth:`~FakeArmServer.plant_machine` makes a machine exist beforehand (someone else's, say).
Every request is recorded (:attr:`~FakeArmServer.requests`), every deletion too
(:attr:`~FakeArmServer.deletions`).
"""

from __future__ import annotations

import json
import re
import ssl
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import IPv4Address
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlsplit

from azure.core.credentials import AccessToken

from fleetledger.domain.machines import REQUEST_TAG

__all__ = ["FakeArmServer", "RecordedRequest", "StaticTokenCredential"]

# Codes of the AKS batch PUT's per-machine error bodies.
_BATCH_CLIENT_ERROR = "BatchMachineClientError"
_BATCH_INTERNAL_ERROR = "BatchMachineInternalServerError"

_SEGMENT = r"[^/]+"
_VM_PATH = re.compile(
    rf"^/subscriptions/(?P<sub>{_SEGMENT})/resourceGroups/(?P<rg>{_SEGMENT})"
    rf"/providers/Microsoft\.Compute/virtualMachines/(?P<name>{_SEGMENT})$",
    re.IGNORECASE,
)
_AKS_PATH = re.compile(
    rf"^(?P<prefix>/subscriptions/(?P<sub>{_SEGMENT})/resourceGroups/{_SEGMENT}"
    rf"/providers/Microsoft\.ContainerService/managedClusters/{_SEGMENT}"
    rf"/agentPools/{_SEGMENT}/machines/)(?P<name>{_SEGMENT})$",
    re.IGNORECASE,
)
_AKS_LIST_PATH = re.compile(
    rf"^/subscriptions/{_SEGMENT}/resourceGroups/{_SEGMENT}"
    rf"/providers/Microsoft\.ContainerService/managedClusters/{_SEGMENT}"
    rf"/agentPools/{_SEGMENT}/machines$",
    re.IGNORECASE,
)
_POOL_PATH = re.compile(
    rf"^/subscriptions/{_SEGMENT}/resourceGroups/{_SEGMENT}"
    rf"/providers/Microsoft\.ContainerService/managedClusters/{_SEGMENT}"
    rf"/agentPools/(?P<pool>{_SEGMENT})(?P<delete>/deleteMachines)?$",
    re.IGNORECASE,
)
_OPERATION_PATH = re.compile(
    rf"^/subscriptions/{_SEGMENT}/providers/{_SEGMENT}/locations/{_SEGMENT}"
    rf"/operations/(?P<id>{_SEGMENT})$",
    re.IGNORECASE,
)


class StaticTokenCredential:
    """A ``TokenCredential`` that always returns the same token; for tests against the fake."""

    token = "fake-arm-token"

    def get_token(
        self,
        *scopes: str,
        claims: str | None = None,
        tenant_id: str | None = None,
        enable_cae: bool = False,
        **kwargs: Any,
    ) -> AccessToken:
        return AccessToken(self.token, int(time.time()) + 3600)


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request received, and the status answered (``None``: the connection was dropped)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]
    body: bytes
    status: int | None

    def header(self, name: str) -> str | None:
        """A header's value, looked up case-insensitively."""
        lowered = name.lower()
        return next((v for k, v in self.headers.items() if k.lower() == lowered), None)

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass(slots=True)
class _Machine:
    name: str
    kind: str  # "vm" or "aks"
    resource_id: str
    zones: list[str]
    tags: dict[str, str]
    properties: dict[str, Any]
    state: str  # ARM provisioningState: Creating, Succeeded, Failed, Deleting
    error: dict[str, str] | None = None  # set when state is Failed
    pending_error: dict[str, str] | None = None  # the failure its create will end in
    polls_left: int = 0  # GETs still answered Creating (AKS machines settle on their own GETs)
    broken_gets: int = 0  # GETs still answered 500
    ends_deleting: bool = False  # its create ends in Deleting (deleted under the create)


@dataclass(slots=True)
class _Operation:
    kind: str
    url: str
    created: list[str]  # machines this operation makes; it settles their state when it ends
    reported: list[str]  # machines its result speaks about (an AKS batch includes existing ones)
    polls_left: int
    unreported: set[str] = field(default_factory=set)
    failures: dict[str, dict[str, str]] = field(default_factory=dict)
    done: bool = False


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int | None  # None: drop the connection without answering
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)


class FakeArmServer:
    """A threaded HTTPS server on ``127.0.0.1``; use as a context manager."""

    def __init__(
        self, *, location: str = "westus3", polls_before_done: int = 1, list_page_size: int = 100
    ) -> None:
        if polls_before_done < 0:
            raise ValueError(f"polls_before_done must be >= 0, got {polls_before_done}")
        if list_page_size < 1:
            raise ValueError(f"list_page_size must be >= 1, got {list_page_size}")
        self._list_page_size = list_page_size
        self._listings: dict[str, list[str]] = {}
        self._unlisted: dict[str, int] = {}
        self._deleting: set[str] = set()
        self._broken_lists = 0
        self.location = location
        self._polls_before_done = polls_before_done
        self._cond = threading.Condition()
        self._requests: list[RecordedRequest] = []
        self._machines: dict[str, _Machine] = {}
        self._operations: dict[str, _Operation] = {}
        self._creations: list[str] = []
        self._quota: int | None = None
        self._async_failures: dict[str, dict[str, str]] = {}
        self._lost: set[str] = set()
        self._throttles: list[float | None] = []  # None: a create let through
        self._drops = 0
        self._late_failures: list[tuple[int, str, str]] = []
        self._broken_polls = 0
        self._refusals: dict[str, tuple[str, str, bool]] = {}
        self._put_failures: list[tuple[int, str, str]] = []
        self._pools: dict[str, str] = {}
        self._deletions: list[str] = []
        self._gate: tuple[int, float] | None = None
        self._in_flight = 0
        self._max_in_flight = 0
        self._tmp = tempfile.TemporaryDirectory(prefix="fake-arm-")
        self._ca_bundle, key = _write_self_signed_certificate(Path(self._tmp.name))
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(self._ca_bundle, key)
        self._httpd = _TlsServer(("127.0.0.1", 0), _handler_for(self), self._tls)
        # A short poll interval makes close() quick: shutdown() waits for the loop to look up.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.01,), name="fake-arm", daemon=True
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
        self._tmp.cleanup()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"https://{host!s}:{port}"

    @property
    def ca_bundle(self) -> str:
        """PEM file of the server's self-signed certificate, for ``connection_verify``."""
        return str(self._ca_bundle)

    def client_options(self, *, retry_total: int = 0) -> dict[str, Any]:
        """Keyword arguments that point an azure-mgmt client at this server.

        TLS verified against :attr:`ca_bundle`; ``polling_interval=0`` (the server also sends
        ``Retry-After: 0``) so LRO polling never sleeps; ``retry_total=0`` so a 429 surfaces at
        once instead of being retried by azure-core's ``RetryPolicy``.
        """
        return {
            "base_url": self.url,
            "connection_verify": self.ca_bundle,
            "retry_total": retry_total,
            "polling_interval": 0,
        }

    # -- scripting -----------------------------------------------------------------------------

    def set_quota(self, quota: int | None) -> None:
        """At most ``quota`` live machines; a create beyond it gets 409 ``OperationNotAllowed``."""
        with self._cond:
            self._quota = quota

    def fail_async(
        self, machine_name: str, code: str = "ZonalAllocationFailed", message: str | None = None
    ) -> None:
        """Accept the next create of ``machine_name``, then fail it in its async operation."""
        text = message or f"Allocation failed for {machine_name}: {code}"
        with self._cond:
            self._async_failures[machine_name] = {"code": code, "message": text}

    def lose_response(self, machine_name: str) -> None:
        """Create ``machine_name`` on its next create, but lose the answer about it.

        A VM PUT has its connection dropped after the VM was made; an AKS machine (whose batch
        answer says nothing per machine) has its first read answered 500.
        """
        with self._cond:
            self._lost.add(machine_name)

    def drop_next_puts(self, count: int = 1) -> None:
        """Handle the next ``count`` PUTs fully, then drop the connection instead of answering."""
        with self._cond:
            self._drops += count

    def break_next_polls(self, count: int = 1) -> None:
        """Answer the next ``count`` operation polls with 500, leaving the operations untouched."""
        with self._cond:
            self._broken_polls += count

    def throttle(self, *, retry_after: float, count: int = 1, after: int = 0) -> None:
        """Answer ``count`` creates with 429 ``TooManyRequests`` and ``Retry-After``: the next
        ones, or those after the next ``after`` (which are served)."""
        with self._cond:
            self._throttles.extend([None] * after + [retry_after] * count)

    def refuse_machine(
        self,
        machine_name: str,
        code: str = "InvalidParameter",
        message: str | None = None,
        *,
        internal: bool = False,
    ) -> None:
        """Refuse ``machine_name`` synchronously in its next AKS batch PUT (nothing is made).

        ``internal`` makes it a server-side failure (``BatchMachineInternalServerError``).
        """
        text = message or f"machine {machine_name} was refused: {code}"
        with self._cond:
            self._refusals[machine_name] = (code, text, internal)

    def fail_next_puts(self, status: int, code: str, message: str, *, count: int = 1) -> None:
        """Answer the next ``count`` PUTs with an ordinary ARM error; nothing is created."""
        with self._cond:
            self._put_failures.extend([(status, code, message)] * count)

    def fail_next_puts_after_handling(
        self, status: int, code: str, message: str, *, count: int = 1
    ) -> None:
        """Handle the next ``count`` PUTs fully (their machines are made), then answer each with
        an ordinary ARM error instead: a 5xx that says nothing of what was started."""
        with self._cond:
            self._late_failures.extend([(status, code, message)] * count)

    def delete_while_creating(self, machine_name: str) -> None:
        """Accept the next create of ``machine_name``; where it would settle, it is ``Deleting``
        instead (something deleted it under the create), and stays so."""
        with self._cond:
            self._deleting.add(machine_name)

    def hide_from_lists(self, machine_name: str, *, lists: int = 1) -> None:
        """Leave ``machine_name`` out of the next ``lists`` listings of the pool (a list that
        lags the machine's own GET)."""
        with self._cond:
            self._unlisted[machine_name] = lists

    def break_next_lists(self, count: int = 1) -> None:
        """Answer the next ``count`` list requests of a pool's machines with 500."""
        with self._cond:
            self._broken_lists += count

    def set_agent_pool(self, pool: str, *, mode: str | None) -> None:
        """Give ``pool`` a mode (``None``: the pool does not exist). Unset pools are Machines."""
        with self._cond:
            self._pools[pool] = mode or ""

    def plant_machine(
        self,
        machine_name: str,
        *,
        kind: str = "aks",
        tags: Mapping[str, str] | None = None,
        state: str = "Succeeded",
    ) -> None:
        """Make ``machine_name`` exist already (made by someone else, or by an earlier run)."""
        subscription = "00000000-0000-0000-0000-000000000000"
        if kind == "vm":
            resource_id = (
                f"/subscriptions/{subscription}/resourceGroups/rg/providers"
                f"/Microsoft.Compute/virtualMachines/{machine_name}"
            )
        else:
            resource_id = (
                f"/subscriptions/{subscription}/resourceGroups/rg/providers"
                f"/Microsoft.ContainerService/managedClusters/other/agentPools/other"
                f"/machines/{machine_name}"
            )
        machine = _Machine(machine_name, kind, resource_id, [], dict(tags or {}), {}, state)
        if state == "Failed":
            machine.error = {"code": "AllocationFailed", "message": "planted failure"}
        with self._cond:
            self._machines[machine_name] = machine

    def gate_puts(self, *, release_at: int, timeout: float) -> None:
        """Hold each PUT until ``release_at`` PUTs are in flight at once, or ``timeout`` passes.

        Used to measure a client's parallelism: a client bounded below ``release_at`` never
        opens the gate (each wave waits ``timeout``), one that is not reaches it at once.
        """
        with self._cond:
            self._gate = (release_at, timeout)

    # -- observation ---------------------------------------------------------------------------

    @property
    def requests(self) -> tuple[RecordedRequest, ...]:
        with self._cond:
            return tuple(self._requests)

    def machine_lists(self) -> tuple[RecordedRequest, ...]:
        """The list requests of a pool's machines (every page), in order."""
        return tuple(r for r in self.requests if r.method == "GET" and _AKS_LIST_PATH.match(r.path))

    def machine_reads(self) -> tuple[RecordedRequest, ...]:
        """The GETs of one AKS machine, in order."""
        return tuple(r for r in self.requests if r.method == "GET" and _AKS_PATH.match(r.path))

    def puts(self) -> tuple[RecordedRequest, ...]:
        """The PUT requests received, in order."""
        return tuple(r for r in self.requests if r.method == "PUT")

    @property
    def creations(self) -> tuple[str, ...]:
        """Machine names in the order machines came into existence; a name appears at most once."""
        with self._cond:
            return tuple(self._creations)

    @property
    def deletions(self) -> tuple[str, ...]:
        """Machine names deleted, in order."""
        with self._cond:
            return tuple(self._deletions)

    def machine_names(self) -> tuple[str, ...]:
        """Names of the machines that exist now, in creation order."""
        with self._cond:
            return tuple(self._machines)

    def machine_tags(self, machine_name: str) -> dict[str, str]:
        """The tags ``machine_name`` carries; ``KeyError`` if it does not exist."""
        with self._cond:
            return dict(self._machines[machine_name].tags)

    def machine_state(self, machine_name: str) -> str:
        """``machine_name``'s provisioning state; ``KeyError`` if it does not exist."""
        with self._cond:
            return self._machines[machine_name].state

    @property
    def max_concurrent_puts(self) -> int:
        with self._cond:
            return self._max_in_flight

    # -- request handling (called from handler threads) -----------------------------------------

    def _handle(self, method: str, target: str, headers: Mapping[str, str], body: bytes) -> _Reply:
        split = urlsplit(target)
        query = dict(parse_qsl(split.query))
        lowered = {k.lower(): v for k, v in headers.items()}
        if not lowered.get("authorization", "").startswith("Bearer "):
            reply = _error(401, "AuthenticationFailed", "no bearer token")
        elif method == "PUT":
            reply = self._put(split.path, query, lowered, body)
        elif method == "GET":
            reply = self._get(split.path, query)
        elif method in ("DELETE", "POST"):
            reply = self._delete(method, split.path, body)
        else:
            reply = _error(405, "MethodNotAllowed", f"{method} is not served by the fake")
        with self._cond:
            self._requests.append(
                RecordedRequest(method, split.path, query, dict(headers), body, reply.status)
            )
        return reply

    def _put(
        self, path: str, query: Mapping[str, str], headers: Mapping[str, str], body: bytes
    ) -> _Reply:
        with self._cond:
            self._in_flight += 1
            self._max_in_flight = max(self._max_in_flight, self._in_flight)
            self._cond.notify_all()
            if self._gate is not None:
                release_at, timeout = self._gate
                self._cond.wait_for(lambda: self._in_flight >= release_at, timeout=timeout)
            try:
                retry_after = self._throttles.pop(0) if self._throttles else None
                if retry_after is not None:
                    return _error(
                        429,
                        "TooManyRequests",
                        "The request is being throttled.",
                        {"Retry-After": _format_seconds(retry_after)},
                    )
                if self._put_failures:
                    status, code, message = self._put_failures.pop(0)
                    return _error(status, code, message)
                reply = self._create(path, query, headers, json.loads(body) if body else {})
                if self._drops > 0:
                    self._drops -= 1
                    return _Reply(None)
                if self._late_failures:
                    status, code, message = self._late_failures.pop(0)
                    return _error(status, code, message)
                return reply
            finally:
                # Leave the count before the answer is written, so a bounded client's next PUT
                # (sent only after it reads this answer) can never be counted alongside this one.
                self._in_flight -= 1

    def _create(
        self,
        path: str,
        query: Mapping[str, str],
        headers: Mapping[str, str],
        payload: dict[str, Any],
    ) -> _Reply:
        if vm := _VM_PATH.match(path):
            return self._put_vm(path, vm["sub"], vm["name"], headers, payload)
        if aks := _AKS_PATH.match(path):
            if not _is_preview(query.get("api-version")):
                return _error(
                    400,
                    "NoRegisteredProviderFound",
                    f"machines cannot be created in API version {query.get('api-version')}",
                )
            return self._put_aks(aks["prefix"], aks["sub"], aks["name"], headers, payload)
        return _error(404, "InvalidResourceType", f"no such resource type: {path}")

    def _put_vm(
        self,
        path: str,
        subscription: str,
        name: str,
        headers: Mapping[str, str],
        payload: dict[str, Any],
    ) -> _Reply:
        existing = self._machines.get(name)
        if existing is not None:
            if headers.get("if-none-match") == "*":
                # ARM's answer to a create-only PUT on an existing resource.
                return _error(412, "PreconditionFailed", f"virtual machine {name} already exists")
            return _Reply(200, self._vm_json(existing, instance_view=False))
        if self._over_quota(1):
            return _quota_error()
        machine = _Machine(
            name=name,
            kind="vm",
            resource_id=path,
            zones=list(payload.get("zones") or []),
            tags=dict(payload.get("tags") or {}),
            properties=dict(payload.get("properties") or {}),
            state="Creating",
        )
        operation = self._start([machine], [name], "Microsoft.Compute", subscription)
        if name in operation.unreported:
            return _Reply(None)
        return _Reply(
            201, self._vm_json(machine, instance_view=False), self._lro_headers(operation)
        )

    def _put_aks(
        self,
        prefix: str,
        subscription: str,
        url_name: str,
        headers: Mapping[str, str],
        payload: dict[str, Any],
    ) -> _Reply:
        listed = _batch_machines(headers.get("batchputmachine"), url_name, payload)
        if listed is None:
            return _error(400, "InvalidBatchPutMachineHeader", "header is not the expected JSON")
        if listed[0]["machineName"] != url_name:
            return _error(400, "InvalidParameter", "the URL must name the header's first machine")
        untagged = [m["machineName"] for m in listed if not (m.get("tags") or {}).get(REQUEST_TAG)]
        if untagged:
            # Not the service's rule but the controller's: every machine it makes names its
            # request, so a batch that would make one that does not is refused before anything.
            return _error(
                400,
                "MissingRequestTag",
                f"machine(s) {', '.join(untagged)} carry no {REQUEST_TAG} tag in the header",
            )
        failures: list[tuple[dict[str, str], bool]] = []
        new: list[dict[str, Any]] = []
        for entry in listed:
            name = entry["machineName"]
            if name in self._machines:
                # The service refuses to "create" a machine that exists, whoever made it: this is
                # what a replayed batch PUT meets for the machines its first attempt started.
                failure = {"code": "OperationNotAllowed", "message": f"machine {name} exists"}
                failures.append(({**failure, "target": name}, False))
            elif refusal := self._refusals.pop(name, None):
                code, message, internal = refusal
                failures.append(({"code": code, "message": message, "target": name}, internal))
            else:
                new.append(entry)
        # AKS checks quota for the batch as a whole: all its new machines fit, or none is made.
        if self._over_quota(len(new)):
            return _quota_error()
        # Batch mode: the body's zones and tags are discarded; each machine gets its header
        # entry's own (see the module docstring). Without the header the body is the machine's.
        shared = {k: v for k, v in (payload.get("properties") or {}).items() if k != "tags"}
        machines = [
            _Machine(
                name=m["machineName"],
                kind="aks",
                resource_id=prefix + m["machineName"],
                zones=list(m.get("zones") or []),
                tags=dict(m.get("tags") or {}),
                properties=dict(shared),
                state="Creating",
                polls_left=self._polls_before_done,
            )
            for m in new
        ]
        # The operation covers the machine the URL names, and only it.
        first = [m for m in machines if m.name == url_name]
        operation = self._start(
            machines, [m.name for m in first], "Microsoft.ContainerService", subscription
        )
        if failures:
            return _batch_failure(failures)
        return _Reply(201, self._aks_json(first[0], preview=True), self._lro_headers(operation))

    def _start(
        self, machines: list[_Machine], reported: list[str], namespace: str, subscription: str
    ) -> _Operation:
        """Create ``machines`` (consuming their scripts) under one new async operation."""
        operation_id = uuid.uuid4().hex
        operation = _Operation(
            kind="vm" if namespace == "Microsoft.Compute" else "aks",
            url=(
                f"{self.url}/subscriptions/{subscription}/providers/{namespace}"
                f"/locations/{self.location}/operations/{operation_id}?api-version=fake"
            ),
            created=[m.name for m in machines],
            reported=reported,
            polls_left=self._polls_before_done,
        )
        self._operations[operation_id] = operation
        for machine in machines:
            self._machines[machine.name] = machine
            self._creations.append(machine.name)
            lost = machine.name in self._lost
            self._lost.discard(machine.name)
            failure = self._async_failures.pop(machine.name, None)
            machine.ends_deleting = machine.name in self._deleting
            self._deleting.discard(machine.name)
            if machine.kind == "aks":
                # The batch answer says nothing per machine; a lost result is a machine whose
                # first read fails, and a failure shows in the machine's own state.
                machine.broken_gets = 1 if lost else 0
                machine.pending_error = failure
                if failure is not None:
                    operation.failures[machine.name] = failure
            elif lost:
                machine.state = "Succeeded"
                operation.unreported.add(machine.name)
            elif failure is not None:
                operation.failures[machine.name] = failure
        return operation

    @staticmethod
    def _lro_headers(operation: _Operation) -> dict[str, str]:
        url = operation.url
        return {"Azure-AsyncOperation": url, "Location": url, "Retry-After": "0"}

    def _get(self, path: str, query: Mapping[str, str]) -> _Reply:
        with self._cond:
            if operation_match := _OPERATION_PATH.match(path):
                operation = self._operations.get(operation_match["id"])
                if operation is None:
                    return _error(404, "NotFound", "no such operation")
                if self._broken_polls > 0:
                    self._broken_polls -= 1
                    return _error(500, "InternalServerError", "the poll failed, not the create")
                return _Reply(200, self._poll(operation), {"Retry-After": "0"})
            if pool := _POOL_PATH.match(path):
                return self._agent_pool(pool["pool"])
            if _AKS_LIST_PATH.match(path):
                return self._list_aks(path, query)
            match = _VM_PATH.match(path) or _AKS_PATH.match(path)
            if match is None:
                return _error(404, "InvalidResourceType", f"no such resource type: {path}")
            machine = self._machines.get(match["name"])
            if machine is None:
                return _error(404, "ResourceNotFound", f"resource {match['name']} was not found")
            if machine.kind == "vm":
                expand = query.get("$expand", "").lower() == "instanceview"
                return _Reply(200, self._vm_json(machine, instance_view=expand))
            # Reads are the fake's clock: a machine moves on with each, answered or not.
            self._advance(machine)
            if machine.broken_gets > 0:
                machine.broken_gets -= 1
                return _error(500, "InternalServerError", "the read failed, not the machine")
            preview = _is_preview(query.get("api-version"))
            return _Reply(200, self._aks_json(machine, preview=preview))

    def _list_aks(self, path: str, query: Mapping[str, str]) -> _Reply:
        """One page of the pool's machines; the first page takes the listing's snapshot."""
        if self._broken_lists > 0:
            self._broken_lists -= 1
            return _error(500, "InternalServerError", "the list failed, not the machines")
        token = query.get("$skipToken")
        if token is None:
            listing_id, offset = uuid.uuid4().hex, 0
            self._listings[listing_id] = self._listed_names()
        else:
            listing_id, _, start = token.partition(":")
            if listing_id not in self._listings or not start.isdigit():
                return _error(400, "InvalidSkipToken", f"no such listing page: {token}")
            offset = int(start)
        names = self._listings[listing_id]
        page = names[offset : offset + self._list_page_size]
        preview = _is_preview(query.get("api-version"))
        value = []
        for name in page:
            machine = self._machines.get(name)
            if machine is None:
                continue  # deleted since the listing began
            self._advance(machine)
            value.append(self._aks_json(machine, preview=preview))
        body: dict[str, Any] = {"value": value}
        following = offset + self._list_page_size
        if following < len(names):
            body["nextLink"] = (
                f"{self.url}{path}?$skipToken={listing_id}:{following}"
                f"&api-version={query.get('api-version', '')}"
            )
        else:
            del self._listings[listing_id]
        return _Reply(200, body)

    def _listed_names(self) -> list[str]:
        """AKS machines a list shows now: not those hidden, nor one whose lost answer is still
        to be met by its own read (a list showing it would settle it unseen)."""
        names: list[str] = []
        for machine in self._machines.values():
            if machine.kind != "aks" or machine.broken_gets > 0:
                continue
            hidden = self._unlisted.get(machine.name, 0)
            if hidden > 0:
                self._unlisted[machine.name] = hidden - 1
                continue
            names.append(machine.name)
        return names

    def _advance(self, machine: _Machine) -> None:
        """An AKS machine's own read moves it on: ``polls_left`` reads of Creating, then done."""
        if machine.state != "Creating":
            return
        if machine.polls_left > 0:
            machine.polls_left -= 1
            return
        self._settle(machine)

    @staticmethod
    def _settle(machine: _Machine) -> None:
        if machine.state != "Creating":
            return
        if machine.ends_deleting:
            machine.state = "Deleting"
            return
        machine.error = machine.pending_error
        machine.state = "Failed" if machine.error else "Succeeded"

    def _agent_pool(self, pool: str) -> _Reply:
        mode = self._pools.get(pool, "Machines")
        if not mode:
            return _error(404, "NotFound", f"agent pool {pool} was not found")
        return _Reply(
            200,
            {
                "id": f"/subscriptions/fake/agentPools/{pool}",
                "name": pool,
                "properties": {"mode": mode, "provisioningState": "Succeeded"},
            },
        )

    def _delete(self, method: str, path: str, body: bytes) -> _Reply:
        if method == "POST":
            pool = _POOL_PATH.match(path)
            if pool is None or not pool["delete"]:
                return _error(404, "InvalidResourceType", f"no such action: {path}")
            names = list((json.loads(body) if body else {}).get("machineNames") or [])
            kind = "aks"
        else:
            match = _VM_PATH.match(path)
            if match is None:
                return _error(404, "InvalidResourceType", f"no such resource type: {path}")
            names, kind = [match["name"]], "vm"
        with self._cond:
            for name in names:
                machine = self._machines.get(name)
                if machine is not None and machine.kind == kind:
                    del self._machines[name]
                    self._deletions.append(name)
        if method == "POST":
            # Accepted; the fake deletes at once, so the status URL already says Succeeded.
            return _Reply(202, None, {"Location": self._done_url(), "Retry-After": "0"})
        return _Reply(200 if names[0] in self._deletions else 204)

    def _done_url(self) -> str:
        operation_id = uuid.uuid4().hex
        operation = _Operation("aks", "", [], [], 0, done=True)
        with self._cond:
            self._operations[operation_id] = operation
        return (
            f"{self.url}/subscriptions/fake/providers/Microsoft.ContainerService"
            f"/locations/{self.location}/operations/{operation_id}?api-version=fake"
        )

    def _poll(self, operation: _Operation) -> dict[str, Any]:
        if operation.polls_left > 0:
            operation.polls_left -= 1
            return {"status": "InProgress"}
        if not operation.done:
            operation.done = True
            for name in operation.created:
                machine = self._machines.get(name)
                if machine is not None and machine.state == "Creating":
                    machine.pending_error = operation.failures.get(name)
                    self._settle(machine)
        return self._operation_result(operation)

    def _operation_result(self, operation: _Operation) -> dict[str, Any]:
        reported = [
            self._machines[n]
            for n in operation.reported
            if n not in operation.unreported and n in self._machines
        ]
        failed = [m for m in reported if m.state == "Failed"]
        result: dict[str, Any] = {"status": "Failed" if failed else "Succeeded"}
        if failed:
            result["error"] = failed[0].error
        return result

    # -- representations ---------------------------------------------------------------------

    def _vm_json(self, machine: _Machine, *, instance_view: bool) -> dict[str, Any]:
        properties = {**machine.properties, "provisioningState": machine.state}
        if instance_view:
            properties["instanceView"] = {"statuses": [_provisioning_status(machine)]}
        return {
            "id": machine.resource_id,
            "name": machine.name,
            "type": "Microsoft.Compute/virtualMachines",
            "location": self.location,
            "zones": machine.zones,
            "tags": machine.tags,
            "properties": properties,
        }

    def _aks_json(self, machine: _Machine, *, preview: bool) -> dict[str, Any]:
        properties: dict[str, Any] = {
            **machine.properties,
            "tags": machine.tags,
            "resourceId": (
                f"/subscriptions/fake/resourceGroups/MC_fake/providers/"
                f"Microsoft.Compute/virtualMachines/{machine.name}"
            ),
        }
        # The stable API's machine has neither field: only the preview says how a create went.
        if preview:
            properties["provisioningState"] = machine.state
            if machine.error is not None:
                properties["status"] = {"provisioningError": machine.error}
        return {
            "id": machine.resource_id,
            "name": machine.name,
            "type": "Microsoft.ContainerService/managedClusters/agentPools/machines",
            "zones": machine.zones,
            "properties": properties,
        }

    def _over_quota(self, extra: int) -> bool:
        live = sum(1 for m in self._machines.values() if m.state != "Failed")
        return self._quota is not None and live + extra > self._quota


def _batch_machines(
    header: str | None, url_name: str, payload: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """Machines of an AKS PUT: the header's list, or just the URL's machine without a header."""
    if header is None:
        return [
            {
                "machineName": url_name,
                "zones": payload.get("zones") or [],
                "tags": (payload.get("properties") or {}).get("tags") or {},
            }
        ]
    try:
        machines = json.loads(header)["batchMachines"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(machines, list) or not machines:
        return None
    return machines


def _is_preview(api_version: str | None) -> bool:
    return bool(api_version) and str(api_version).endswith("-preview")


def _batch_failure(failures: list[tuple[dict[str, str], bool]]) -> _Reply:
    """The flat error body of a batch PUT that could not start every machine."""
    details = [detail for detail, _ in failures]
    if any(not internal for _, internal in failures):
        body = {
            "code": _BATCH_CLIENT_ERROR,
            "message": f"{len(details)} machine(s) could not be created",
            "details": details,
        }
        return _Reply(400, body)
    body = {"code": _BATCH_INTERNAL_ERROR, "message": json.dumps({"details": details})}
    return _Reply(500, body)


def _provisioning_status(machine: _Machine) -> dict[str, str]:
    # Compute's instance view spells a failed create "ProvisioningState/failed/<ARM code>".
    if machine.state == "Failed" and machine.error is not None:
        return {
            "code": f"ProvisioningState/failed/{machine.error['code']}",
            "level": "Error",
            "displayStatus": "Provisioning failed",
            "message": machine.error["message"],
        }
    return {
        "code": f"ProvisioningState/{machine.state.lower()}",
        "level": "Info",
        "displayStatus": f"Provisioning {machine.state.lower()}",
    }


def _quota_error() -> _Reply:
    return _error(
        409,
        "OperationNotAllowed",
        "Operation could not be completed as it results in exceeding approved "
        "standardDSv3Family Cores quota.",
    )


def _error(
    status: int, code: str, message: str, headers: Mapping[str, str] | None = None
) -> _Reply:
    return _Reply(status, {"error": {"code": code, "message": message}}, dict(headers or {}))


def _format_seconds(seconds: float) -> str:
    return str(int(seconds)) if float(seconds).is_integer() else str(seconds)


class _TlsServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        tls: ssl.SSLContext,
    ) -> None:
        super().__init__(address, handler)
        self._tls = tls

    def finish_request(self, request: Any, client_address: Any) -> None:
        # Wrap per connection, in the connection's own thread, so a slow or failed handshake
        # never blocks the accept loop.
        try:
            wrapped = self._tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError):
            return
        # socketserver closes the raw socket, which wrapping detached; close the TLS one here.
        with wrapped:
            super().finish_request(wrapped, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients dropping keep-alive connections at shutdown are expected; stay quiet.
        return


def _handler_for(server: FakeArmServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body go out in two writes; without TCP_NODELAY, Nagle's algorithm meets the
        # client's delayed ACK and every answer waits ~40 ms.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            reply = server._handle(method, self.path, dict(self.headers.items()), body)
            if reply.status is None:
                self.close_connection = True
                return
            data = json.dumps(reply.body).encode() if reply.body is not None else b""
            self.send_response(reply.status)
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler


def _write_self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A fresh P-256 key and a self-signed certificate for 127.0.0.1 and localhost."""
    # Imported here: only the test server needs it. cryptography is always present, as
    # azure-identity (a fleetledger dependency) requires it.
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fleetledger fake ARM")])
    now = datetime.now(UTC)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(IPv4Address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path = directory / "cert.pem"
    key_path = directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path
