"""A loopback TCP proxy that can cut every connection through it: database outages on demand.

Put it between a process and its database (:func:`proxied_url` rewrites a URL to go through it)
and call :meth:`TcpProxy.cut` to play a lost network: every open connection is reset and new ones
are refused (accepted and reset at once, so a client fails fast instead of waiting out its
connect timeout) until :meth:`TcpProxy.restore`. The reliability bench and the outage tests use
it; nothing in the product does.

One thread accepts; each connection has two pump threads (one per direction) doing blocking
``recv``/``sendall``. A cut closes the sockets under them, which ends both pumps.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

import structlog
from sqlalchemy.engine import make_url

__all__ = ["TcpProxy", "proxied_url"]

log = structlog.get_logger("bench.tcp_proxy")

_CHUNK = 65_536
# SO_LINGER on, timeout 0: close() sends a reset instead of a polite FIN, as a dropped network
# (or a killed server) looks to the client.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class TcpProxy:
    """Forwards ``listen_host:port`` (chosen freely unless given) to ``target``; thread-safe."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server((listen_host, listen_port), reuse_port=False)
        self.host, self.port = self._listener.getsockname()[:2]
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._down = False
        self._closed = False
        self._accepted = 0
        self._refused = 0
        self._cuts = 0
        self._thread = threading.Thread(
            target=self._accept_loop, name=f"tcp-proxy-{self.port}", daemon=True
        )
        self._thread.start()

    # -- faults --------------------------------------------------------------------------------

    def cut(self) -> int:
        """Reset every open connection and refuse new ones until :meth:`restore`; returns how
        many connections were cut."""
        with self._lock:
            self._down = True
            self._cuts += 1
            sockets, self._open = self._open, set()
        for sock in sockets:
            _reset(sock)
        # Each connection has two sockets (client side and server side).
        cut = len(sockets) // 2
        log.info("proxy cut", port=self.port, connections=cut)
        return cut

    def restore(self) -> None:
        """Accept and forward connections again."""
        with self._lock:
            self._down = False
        log.info("proxy restored", port=self.port)

    def drop(self) -> int:
        """Reset every open connection but keep accepting new ones (a blip, not an outage)."""
        cut = self.cut()
        self.restore()
        return cut

    # -- figures ---------------------------------------------------------------------------------

    @property
    def down(self) -> bool:
        with self._lock:
            return self._down

    @property
    def cuts(self) -> int:
        """How many times connections were cut (``cut`` and ``drop`` calls)."""
        with self._lock:
            return self._cuts

    @property
    def accepted(self) -> int:
        """Connections forwarded so far."""
        with self._lock:
            return self._accepted

    @property
    def refused(self) -> int:
        """Connections refused while down."""
        with self._lock:
            return self._refused

    def open_connections(self) -> int:
        with self._lock:
            return len(self._open) // 2

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop listening and reset every connection."""
        with self._lock:
            self._closed = True
            sockets, self._open = self._open, set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for sock in sockets:
            _reset(sock)
        self._thread.join(5)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- forwarding --------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            with self._lock:
                if self._closed:
                    _reset(client)
                    return
                down = self._down
                if down:
                    self._refused += 1
            if down:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
                upstream.settimeout(None)
            except OSError as e:
                log.warning("proxy cannot reach its target", target=self._target, error=str(e))
                _reset(client)
                continue
            self._forward(client, upstream)

    def _forward(self, client: socket.socket, upstream: socket.socket) -> None:
        with self._lock:
            if self._down or self._closed:
                # Cut between the accept and now: this connection belongs to the outage too.
                _reset(client)
                _reset(upstream)
                return
            self._open.update((client, upstream))
            self._accepted += 1
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(
                target=self._pump, args=(source, sink), name=f"tcp-proxy-{self.port}-pump",
                daemon=True,
            ).start()  # fmt: skip

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(_CHUNK)
                if not data:
                    break
                sink.sendall(data)
        except OSError:
            pass  # cut, or the other side went away
        # One side ended: end the other as well, so the peer sees the connection close.
        with self._lock:
            ours = source in self._open or sink in self._open
            self._open.discard(source)
            self._open.discard(sink)
        if ours:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                source.shutdown(socket.SHUT_RDWR)
            source.close()
            sink.close()


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
    with contextlib.suppress(OSError):
        # shutdown first: close() alone does not wake a thread blocked in recv on this socket.
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def proxied_url(url: str, proxy: TcpProxy) -> str:
    """``url`` with its host and port replaced by the proxy's (password kept)."""
    parsed = make_url(url).set(host=proxy.host, port=proxy.port)
    return parsed.render_as_string(hide_password=False)
