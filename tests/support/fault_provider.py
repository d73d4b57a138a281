"""A fake payment provider that commits effects and then fails in chosen ways.

opgate's hardest cases are the ones where the agent cannot know what happened: the provider
did the refund and then answered 500, or dropped the connection, or never answered before
the timeout. localstripe always answers, so this provider exists to produce exactly those
outcomes, on a real ``aiohttp.web.Application`` on 127.0.0.1 port 0, and to record the
ground truth: every request it received (``requests``) and every effect it committed
(``effects``).

Each request takes its mode from :attr:`FaultProvider.chooser` when one is set and it names
one (a function of the request: per method, per operation, ...), else the next mode from the
script (:meth:`FaultProvider.script`), else the standing :attr:`FaultProvider.mode`:

=====================  ==================================================================
mode                   what the provider does
=====================  ==================================================================
``ok``                 commits the effect, answers 200 with a refund object
``fail``               commits nothing, answers 402 ``card_declined``
``error_after_commit`` commits the effect, answers 500
``drop_after_commit``  commits the effect, closes the connection without a byte of answer
                       (the client sees ``aiohttp.ServerDisconnectedError``)
``stall``              commits nothing, waits until released, then answers 503
``stall_after_commit`` commits the effect, waits until released, then answers 200
``slow``               like ``ok``, but answers only after :attr:`FaultProvider.slow_seconds`
                       (simulated latency; a GET's list is taken when the request arrives,
                       so a slow lookup answers with what was true when it was asked)
=====================  ==================================================================

"Commits" only applies to unsafe methods (POST, PUT, PATCH, DELETE): a GET under ``ok``
answers 200 with the list of effects, and under a fault mode suffers the same fault.

With :attr:`FaultProvider.deduplicate` on, the provider behaves like Stripe's idempotency
layer: a request whose ``Idempotency-Key`` already committed an effect commits nothing new;
its answer (where the mode gives one) is the first effect's refund object again, with
``Idempotent-Replayed: true``. The idempotency layer answers before any business decision, so
``fail`` on a key that already committed replays the effect too (a deduplicating provider never
declines a request it has already carried out). The same key with different parameters is
refused with 400 ``idempotency_error``. With it off, every committing request is a new effect,
however many times a key repeats.

Stalls are released by :meth:`FaultProvider.release` (or by the fixture's teardown), never
by a timer. :attr:`FaultProvider.in_flight` is set while at least one request is stalled, so
a test can race a second request against one that is definitely in flight.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qsl

import pytest_asyncio
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "Chooser",
    "Effect",
    "FaultMode",
    "FaultProvider",
    "ReceivedRequest",
    "fault_provider",
    "running_fault_provider",
]


class FaultMode(StrEnum):
    """What the provider does with one request; see the module docstring's table."""

    OK = "ok"
    FAIL = "fail"
    ERROR_AFTER_COMMIT = "error_after_commit"
    DROP_AFTER_COMMIT = "drop_after_commit"
    STALL = "stall"
    STALL_AFTER_COMMIT = "stall_after_commit"
    SLOW = "slow"


# Decides one request's mode from the request as it arrives (before its body is read); None
# leaves it to the script and the standing mode.
Chooser = Callable[[web.Request], FaultMode | None]

_COMMITTING = frozenset(
    {
        FaultMode.OK,
        FaultMode.SLOW,
        FaultMode.ERROR_AFTER_COMMIT,
        FaultMode.DROP_AFTER_COMMIT,
        FaultMode.STALL_AFTER_COMMIT,
    }
)
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True)
class ReceivedRequest:
    """One request exactly as it arrived, recorded before the provider acts on it."""

    method: str
    path: str
    query_string: str
    headers: CIMultiDictProxy[str]
    body: bytes
    mode: FaultMode

    @property
    def fields(self) -> dict[str, Any]:
        """The body's parameters: a JSON object as is, a form flattened (last value wins)."""
        return _parse_fields(self.headers.get("Content-Type", ""), self.body)


@dataclass(frozen=True)
class Effect:
    """One committed side effect (a refund), which is what a duplicate would multiply."""

    id: str
    idempotency_key: str | None
    operation_id: str | None
    fields: dict[str, Any]
    amount: int | None
    metadata: dict[str, str]
    request: ReceivedRequest = field(repr=False)

    def as_resource(self) -> dict[str, Any]:
        """The refund object the provider answers with, Stripe-shaped enough for clients."""
        resource: dict[str, Any] = {
            "id": self.id,
            "object": "refund",
            "amount": self.amount,
            "metadata": self.metadata,
            "status": "succeeded",
        }
        for name in ("charge", "payment_intent", "currency"):
            if name in self.fields:
                resource[name] = self.fields[name]
        return resource


def _parse_fields(content_type: str, body: bytes) -> dict[str, Any]:
    """Decode a JSON or form body into a dict; anything else (or nothing) gives ``{}``.

    Undecodable bytes give ``{}`` too rather than a 500: a test may send garbage on purpose,
    and the exact bytes stay in :attr:`ReceivedRequest.body`.
    """
    if not body:
        return {}
    try:
        if content_type.split(";")[0].strip().lower() == "application/json":
            parsed = json.loads(body)
            return parsed if isinstance(parsed, dict) else {"_": parsed}
        return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return {}


def _metadata(fields: Mapping[str, Any]) -> dict[str, str]:
    """Collect ``metadata`` from a JSON object or from Stripe's ``metadata[key]`` form fields."""
    nested = fields.get("metadata")
    if isinstance(nested, dict):
        return {str(k): str(v) for k, v in nested.items()}
    return {
        name[len("metadata[") : -1]: str(value)
        for name, value in fields.items()
        if name.startswith("metadata[") and name.endswith("]")
    }


def _amount(fields: Mapping[str, Any]) -> int | None:
    """The ``amount`` parameter as an int, or None when absent or not a number."""
    try:
        return int(fields["amount"])
    except (KeyError, TypeError, ValueError):
        return None


def _error(status: int, kind: str, code: str, message: str) -> web.Response:
    """A Stripe-shaped JSON error answer."""
    return web.json_response(
        {"error": {"type": kind, "code": code, "message": message}}, status=status
    )


class FaultProvider:
    """The fake provider's controls and ground truth; the fixture serves :meth:`handle`."""

    def __init__(self) -> None:
        self.url = ""
        self.deduplicate = False
        # Provider latency between committing an effect and answering: the window in which a
        # crash of the caller leaves the outcome unknown (the chaos test kills into it).
        self.answer_delay_seconds = 0.0
        # How long a ``slow`` request takes to answer.
        self.slow_seconds = 0.1
        self.chooser: Chooser | None = None
        self.requests: list[ReceivedRequest] = []
        self.effects: list[Effect] = []
        self.in_flight = asyncio.Event()
        self._mode = FaultMode.OK
        self._script: deque[FaultMode] = deque()
        self._ids = itertools.count(1)
        self._first_effect_by_key: dict[str, Effect] = {}
        self._release = asyncio.Event()
        self._stalled = 0
        self._closing = False

    @property
    def mode(self) -> FaultMode:
        """The mode for every request the script does not cover (``ok`` to begin with)."""
        return self._mode

    @mode.setter
    def mode(self, mode: FaultMode | str) -> None:
        self._mode = FaultMode(mode)

    def script(self, *modes: FaultMode | str) -> None:
        """Queue one mode per coming request, in order (e.g. ``error_after_commit``, ``ok``)."""
        self._script.extend(FaultMode(m) for m in modes)

    @property
    def scripted(self) -> tuple[FaultMode, ...]:
        """Modes queued and not yet used by a request."""
        return tuple(self._script)

    @property
    def stalled(self) -> int:
        """How many requests are stalled right now."""
        return self._stalled

    def release(self) -> None:
        """Let every request stalled right now answer; requests arriving later stall anew."""
        self._release.set()
        self._release = asyncio.Event()

    def close(self) -> None:
        """Release all stalls for good, so the server can shut down without waiting on them."""
        self._closing = True
        self.release()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Record the request, then commit and/or fail as its mode says."""
        mode = self._mode_for(request)
        received = ReceivedRequest(
            method=request.method,
            path=request.path,
            query_string=request.query_string,
            headers=CIMultiDictProxy(CIMultiDict(request.headers)),
            body=await request.read(),
            mode=mode,
        )
        self.requests.append(received)

        if mode is FaultMode.FAIL and not self._already_committed(received):
            return _error(402, "card_error", "card_declined", "Your card was declined.")
        if mode is FaultMode.STALL:
            await self._stall()
            return _error(503, "api_error", "stalled", "Released after a stall; nothing done.")

        if received.method not in _UNSAFE_METHODS:
            answer: web.Response = web.json_response(
                {"object": "list", "data": [e.as_resource() for e in self.effects]}
            )
        else:
            committed = self._commit(received)
            if isinstance(committed, web.Response):
                return committed  # refused before any effect (idempotency mismatch)
            effect, replayed = committed
            answer = web.json_response(effect.as_resource())
            if replayed:
                answer.headers["Idempotent-Replayed"] = "true"

        assert mode in _COMMITTING or mode is FaultMode.FAIL  # FAIL here: a replay
        if mode is FaultMode.SLOW:
            await asyncio.sleep(self.slow_seconds)  # simulated latency, not a sync
        if self.answer_delay_seconds and received.method in _UNSAFE_METHODS:
            await asyncio.sleep(self.answer_delay_seconds)  # simulated latency, not a sync
        if mode is FaultMode.ERROR_AFTER_COMMIT:
            return _error(500, "api_error", "internal", "Committed, then failed to answer.")
        if mode is FaultMode.DROP_AFTER_COMMIT:
            return self._drop(request, answer)
        if mode is FaultMode.STALL_AFTER_COMMIT:
            await self._stall()
        return answer

    def _mode_for(self, request: web.Request) -> FaultMode:
        chosen = self.chooser(request) if self.chooser is not None else None
        if chosen is not None:
            return FaultMode(chosen)
        return self._script.popleft() if self._script else self._mode

    def _already_committed(self, received: ReceivedRequest) -> bool:
        """Whether the idempotency layer would replay this request (deduplication on, its
        key already made an effect)."""
        key = received.headers.get("Idempotency-Key")
        return (
            self.deduplicate
            and received.method in _UNSAFE_METHODS
            and key is not None
            and key in self._first_effect_by_key
        )

    def _commit(self, received: ReceivedRequest) -> tuple[Effect, bool] | web.Response:
        """Record a new effect, or with deduplication find the one this key already made."""
        fields = received.fields
        key = received.headers.get("Idempotency-Key")
        if self.deduplicate and key is not None and key in self._first_effect_by_key:
            first = self._first_effect_by_key[key]
            if first.fields != fields or first.request.path != received.path:
                return _error(
                    400,
                    "idempotency_error",
                    "idempotency_key_in_use",
                    "Keys for idempotent requests can only be used with the same parameters.",
                )
            return first, True
        effect = Effect(
            id=f"re_{next(self._ids)}",
            idempotency_key=key,
            operation_id=received.headers.get("X-Operation-Id"),
            fields=fields,
            amount=_amount(fields),
            metadata=_metadata(fields),
            request=received,
        )
        self.effects.append(effect)
        if key is not None:
            self._first_effect_by_key.setdefault(key, effect)
        return effect, False

    async def _stall(self) -> None:
        """Hold this request until :meth:`release`; ``in_flight`` is set while any is held."""
        if self._closing:
            return
        release = self._release
        self._stalled += 1
        self.in_flight.set()
        try:
            await release.wait()
        finally:
            self._stalled -= 1
            if self._stalled == 0:
                self.in_flight.clear()

    @staticmethod
    def _drop(request: web.Request, answer: web.Response) -> web.Response:
        """Close the connection before a single byte of the answer is written.

        The client is left waiting for a status line and reads end-of-stream, which aiohttp
        reports as ``ServerDisconnectedError``. aiohttp then fails to write ``answer`` with a
        ``ConnectionError``, which it treats as a client that went away (no error logged).
        """
        transport = request.transport
        assert transport is not None, "request already lost its connection"
        transport.close()
        return answer


@asynccontextmanager
async def running_fault_provider() -> AsyncIterator[FaultProvider]:
    """Serve a fresh :class:`FaultProvider` on 127.0.0.1 until the block exits.

    On exit every stall is released first (a test may have left one held), so shutting the
    server down never waits on a handler.
    """
    provider = FaultProvider()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port: int = sock.getsockname()[1]
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        provider.url = f"http://127.0.0.1:{port}"
        yield provider
    finally:
        provider.close()
        await runner.cleanup()
        sock.close()


@pytest_asyncio.fixture(loop_scope="session")
async def fault_provider() -> AsyncIterator[FaultProvider]:
    """A fresh fault provider for one test, stopped (stalls released) at its end."""
    async with running_fault_provider() as provider:
        yield provider
