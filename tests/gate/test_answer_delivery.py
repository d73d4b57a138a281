"""An answer written to an agent whose reset has reached opgate's socket, but not yet its event
loop, is on record as undelivered.

The kernel had the reset; the event loop had not read it yet. Writing the answer then fails
inside ``transport.write`` (ECONNRESET or EPIPE), which on asyncio and on uvloop alike closes
the transport and drops the bytes without raising; aiohttp's ``write_eof`` waits only for a
paused transport, so it returned as if the answer had gone. On uvloop this was how
tests/faults/test_audit_durability.py's agent that hangs up mid-answer lost its
``answer_undelivered`` record about one run in three: its reset raced the answer's first write.
Here the race is taken out: the handler resets the agent itself and waits for the reset to
reach opgate's socket (the kernel's word, not a sleep) before the answer is written.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
from typing import Any

from aiohttp import web

from proxy.gate.pipeline import _write_answer
from proxy.observe import audit
from proxy.observe.audit import AuditRecord
from proxy.settings import Settings

ANSWER_BYTES = 1 << 20
REQUEST = b"POST / HTTP/1.1\r\nHost: opgate\r\nContent-Length: 0\r\n\r\n"


class _Queued:
    """The request observer's part ``emit_undelivered`` uses: what it queued."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def admit(self, fields: dict[str, Any]) -> None:
        fields["instance_seq"] = len(self.records) + 1

    def queue(self, fields: dict[str, Any]) -> None:
        self.records.append(fields)


def _reset(agent: socket.socket, server_side: socket.socket) -> None:
    """``agent`` closed with a reset; returns once opgate's end of the connection has it (a
    bounded blocking poll: the event loop must not see the reset before the answer is written)."""
    agent.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    agent.close()
    poller = select.poll()
    poller.register(server_side.fileno(), select.POLLERR | select.POLLHUP)
    assert poller.poll(10_000), "the reset did not reach opgate's socket within 10 s"


async def test_an_answer_written_after_the_agent_reset_is_on_record() -> None:
    queued = _Queued()
    agent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            assert request.transport is not None
            _reset(agent, request.transport.get_extra_info("socket"))
            record = AuditRecord(method="POST", path="/", listener="agent", response_status=200)
            response = web.Response(body=b"x" * ANSWER_BYTES)
            token = audit.REQUEST_OBSERVER.set(queued)  # type: ignore[arg-type]
            try:
                await _write_answer(request, response, record, Settings())
            finally:
                audit.REQUEST_OBSERVER.reset(token)
        except BaseException as exc:
            done.set_exception(exc)
            raise
        done.set_result(None)
        return response

    app = web.Application()
    app.router.add_post("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        agent.setblocking(False)
        await asyncio.get_running_loop().sock_connect(agent, (host, port))
        await asyncio.get_running_loop().sock_sendall(agent, REQUEST)
        await asyncio.wait_for(done, 30)
    finally:
        agent.close()
        await runner.cleanup()
    undelivered = [(r["record_type"], r["reason"]) for r in queued.records]
    assert undelivered == [("answer_undelivered", audit.Undelivered.AGENT_DISCONNECTED)]
