"""The body cap: 413 by declared length or while streaming; bodies within it pass unchanged."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from fleetledger.adapters.http.limits import BodySizeLimit

LIMIT = 1000


def echo_app() -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"received": len(await request.body())}

    app.add_middleware(BodySizeLimit, max_bytes=LIMIT)
    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(echo_app())


def chunks(total: int, size: int = 100) -> Iterator[bytes]:
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


class TestBodySizeLimit:
    def test_a_body_at_the_limit_passes_whole(self, client: TestClient) -> None:
        """Exactly ``max_bytes`` reaches the app, every byte of it."""
        response = client.post("/echo", content=b"x" * LIMIT)

        assert response.json() == {"received": LIMIT}

    def test_a_declared_length_over_the_limit_is_413(self, client: TestClient) -> None:
        """One byte over, announced in Content-Length: refused, saying the limit."""
        response = client.post("/echo", content=b"x" * (LIMIT + 1))

        assert response.status_code == 413
        assert str(LIMIT) in response.json()["detail"]

    def test_a_chunked_body_is_counted_as_it_arrives(self, client: TestClient) -> None:
        """Without Content-Length the stream is cut off once it passes the limit."""
        response = client.post("/echo", content=chunks(50 * LIMIT))

        assert response.status_code == 413

    def test_a_chunked_body_within_the_limit_passes(self, client: TestClient) -> None:
        """Chunks are joined and handed on as one body."""
        response = client.post("/echo", content=chunks(LIMIT - 1))

        assert response.json() == {"received": LIMIT - 1}

    @pytest.mark.parametrize("max_bytes", [0, -1, 1.5, True])
    def test_a_bad_limit_is_refused(self, max_bytes: object) -> None:
        """The limit is validated when the middleware is built, with an example."""
        with pytest.raises(ValueError, match="positive number of bytes"):
            BodySizeLimit(echo_app(), max_bytes=max_bytes)  # type: ignore[arg-type]
