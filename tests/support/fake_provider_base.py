"""What the fake PayPal, Square and Adyen providers share: a real aiohttp app on 127.0.0.1 port
0, the ground truth of what they received and committed, and an idempotency memory that
returns a key's first answer within the provider's retention window (and not after it).

The clock is the test's (``now``), so "after the window" needs no sleeping.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Answer:
    status: int
    body: dict[str, Any]


@dataclass
class Remembered:
    answer: Answer
    fingerprint: str  # what the first request asked for
    at: float


@dataclass
class KeyMemory:
    """A key's first answer, kept ``retention_seconds`` (None: kept forever)."""

    retention_seconds: float | None
    now: Callable[[], float]
    _keys: dict[str, Remembered] = field(default_factory=dict)

    def recall(self, key: str) -> Remembered | None:
        kept = self._keys.get(key)
        if kept is None:
            return None
        if self.retention_seconds is not None and self.now() - kept.at >= self.retention_seconds:
            del self._keys[key]  # forgotten: the key is new again
            return None
        return kept

    def remember(self, key: str, fingerprint: str, answer: Answer) -> None:
        self._keys[key] = Remembered(answer, fingerprint, self.now())


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeProvider:
    """The ground truth: every request received, every effect committed."""

    url: str = ""
    clock: float = 0.0
    requests: list[Received] = field(default_factory=list)
    effects: list[dict[str, Any]] = field(default_factory=list)

    def now(self) -> float:
        return self.clock

    def advance(self, seconds: float) -> None:
        self.clock += seconds

    async def record(self, request: web.Request) -> Any:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = await request.json()
            except ValueError:
                body = raw.decode(errors="replace")
        self.requests.append(Received(request.method, request.path, dict(request.headers), body))
        return body

    def posts(self) -> list[Received]:
        return [r for r in self.requests if r.method == "POST"]


def json_answer(answer: Answer, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(answer.body, status=answer.status, headers=headers)


@asynccontextmanager
async def serving(app: web.Application, provider: FakeProvider) -> AsyncIterator[None]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        provider.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield
    finally:
        await runner.cleanup()
        sock.close()
