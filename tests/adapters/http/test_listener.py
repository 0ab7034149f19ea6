"""The listeners' hardening, against a real uvicorn server on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from fleetledger.adapters.http.auth import ApiTokens, BearerAuth
from fleetledger.adapters.http.listener import (
    ListenerLimits,
    TlsFiles,
    connection_budget,
    uvicorn_settings,
)
from tests.waiting import wait_until

TOKEN = "listener-token-0123456789abcdef"


async def _echo(scope: Scope, receive: Receive, send: Send) -> None:
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    payload = b'{"path":"%s","bytes":%d}' % (scope["path"].encode(), len(body))
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


@contextmanager
def serving(limits: ListenerLimits, **options: Any) -> Iterator[int]:
    """A uvicorn server with ``limits`` over a token-protected echo app; yields its port."""
    app = BearerAuth(_echo, tokens=ApiTokens([TOKEN]))
    settings = uvicorn_settings(authenticated=True, limits=limits, **options)
    config = uvicorn.Config(app, log_config=None, lifespan="off", **settings)
    server = uvicorn.Server(config)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(512)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[listener])), daemon=True
    )
    thread.start()
    wait_until(lambda: server.started, timeout=10, what="the server to start")
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


def raw(port: int, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send ``data`` on a new connection; everything the server sends until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def closed_by_server(s: socket.socket, *, within: float) -> bool:
    """Whether the server closes ``s`` (EOF or reset) within ``within`` seconds."""
    s.settimeout(within)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def get(path: str, *, token: str | None = TOKEN) -> bytes:
    auth = b"" if token is None else b"Authorization: Bearer " + token.encode() + b"\r\n"
    return (
        b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + auth + b"Connection: close\r\n\r\n"
    )


FAST = ListenerLimits(
    idle_seconds=0.5, header_seconds=0.5, body_seconds=0.5, max_connections=64, authenticated=True
)


class TestTimeouts:
    def test_a_connection_that_sends_nothing_is_closed(self) -> None:
        """A socket opened and left silent is closed after the idle timeout."""
        with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
            assert closed_by_server(s, within=3)

    def test_a_slow_head_gets_408(self) -> None:
        """A head trickled in slower than the header timeout is answered 408 and closed."""
        with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /x HTTP/1.1\r\nHost: x\r\n")
            s.settimeout(3)
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 408")

    def test_a_slow_body_gets_408(self) -> None:
        """A body slower than the body timeout is answered 408 and the connection closed."""
        head = (
            b"POST /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
            b"Content-Length: 100\r\n\r\n"
        )
        with serving(FAST) as port, socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(head + b"x" * 10)
            s.settimeout(3)
            answer = s.recv(65536)
            assert closed_by_server(s, within=3)
        assert answer.startswith(b"HTTP/1.1 408")

    def test_an_oversized_head_gets_431(self) -> None:
        """Headers beyond the head limit are refused with 431."""
        limits = ListenerLimits(max_head_bytes=4096, max_connections=64, authenticated=True)
        big = b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8192 + b"\r\n\r\n"
        with serving(limits) as port:
            assert raw(port, big).startswith(b"HTTP/1.1 431")

    def test_a_prompt_request_is_served(self) -> None:
        """The guards leave an ordinary request alone."""
        with serving(FAST) as port:
            answer = raw(port, get("/v1/x"))
        assert answer.startswith(b"HTTP/1.1 200") and b'"path":"/v1/x"' in answer


@contextmanager
def access_level(level: int) -> Iterator[None]:
    access = logging.getLogger("uvicorn.access")
    before = access.level
    access.setLevel(level)  # setLevel, not the attribute: it clears isEnabledFor's cache
    try:
        yield
    finally:
        access.setLevel(before)


class TestAccessLog:
    def test_off_when_its_lines_would_be_dropped(self) -> None:
        with access_level(logging.WARNING):
            assert uvicorn_settings(authenticated=False)["access_log"] is False

    def test_on_when_they_would_be_written(self) -> None:
        with access_level(logging.INFO):
            assert uvicorn_settings(authenticated=False)["access_log"] is True


class TestCredentials:
    def test_a_token_with_a_nul_is_401(self) -> None:
        """An Authorization header the parser cannot take is an unusable token: 401."""
        with serving(FAST) as port:
            answer = raw(port, get("/v1/x", token="abc\x00def"))
        assert answer.startswith(b"HTTP/1.1 401")
        assert b"www-authenticate: Bearer" in answer.lower().replace(b"bearer", b"Bearer")

    def test_a_probe_with_a_bad_header_is_still_400(self) -> None:
        """Probes need no token, so a malformed header there stays the parser's 400."""
        with serving(FAST) as port:
            answer = raw(port, get("/healthz", token="abc\x00def"))
        assert answer.startswith(b"HTTP/1.1 400")


class TestConnectionCap:
    def test_idle_connections_make_room_for_a_probe(self) -> None:
        """Past the cap, the longest-idle connection is closed and a new client is served."""
        limits = ListenerLimits(idle_seconds=60, max_connections=16, authenticated=True)
        with serving(limits) as port:
            idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
            try:
                answer = raw(port, get("/healthz", token=None))
                assert answer.startswith(b"HTTP/1.1 200")
                closed = sum(closed_by_server(s, within=0.2) for s in idle[:20])
                assert closed >= 20 - 16
            finally:
                for s in idle:
                    s.close()

    def test_the_budget_stays_below_the_file_limit(self) -> None:
        """With 1,024 descriptors, the connections of two listeners and the probe reserve leave
        room for everything else."""
        budget = connection_budget(listeners=2, limit=1024)
        assert 2 * (budget + 32) < 1024 - 64


class TestTls:
    def test_tls_is_served_with_the_given_certificate(self, tmp_path: Any) -> None:
        """A listener given a certificate and key answers over TLS."""
        import ssl

        cert, key = self_signed(tmp_path)
        limits = ListenerLimits(max_connections=64, authenticated=True)
        with serving(limits, tls=TlsFiles(cert, key)) as port:
            context = ssl.create_default_context(cafile=str(cert))
            with (
                socket.create_connection(("127.0.0.1", port)) as plain,
                context.wrap_socket(plain, server_hostname="localhost") as s,
            ):
                s.sendall(get("/healthz", token=None))
                answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")

    def test_half_a_pair_is_refused(self, tmp_path: Any) -> None:
        with pytest.raises(ValueError, match="go together"):
            TlsFiles.from_options(str(tmp_path / "c.pem"), None, flag="--tls")


def self_signed(folder: Any) -> tuple[Any, Any]:
    """A certificate for localhost and its key, written under ``folder``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class TestRequiresTokens:
    def test_an_app_behind_bearer_auth_is_recognised(self) -> None:
        """serve gives the 401 for unusable credentials only to listeners that check tokens."""
        from fastapi import FastAPI

        from fleetledger.adapters.http.listener import requires_tokens

        guarded, open_app = FastAPI(), FastAPI()
        guarded.add_middleware(BearerAuth, tokens=ApiTokens([TOKEN]))

        assert requires_tokens(guarded)
        assert requires_tokens(BearerAuth(_echo, tokens=ApiTokens([TOKEN])))
        assert not requires_tokens(open_app)
