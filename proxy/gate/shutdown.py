"""A connection the listener accepted just as opgate began to drain is closed at once, not held
unanswered until the drain deadline.

On SIGTERM aiohttp stops the listener, then closes every connection it has (``pre_shutdown``),
then waits up to the drain deadline for the requests in flight. ``RequestHandler.close`` only
marks a connection closing and wakes the wait for its next request; a connection accepted an
instant before, whose handler task had not yet run, has no such wait yet. Its task then starts
on a connection marked closing, waits for a first request, and ignores the bytes that arrive
(aiohttp drops data on a closing connection): the agent's request hung, unanswered, for the
whole drain, and the connection then closed. Seen here in one run of three at a SIGTERM
(tests/test_workers.py's drain test, aiohttp 3.14): 20 s with ``drain_seconds`` 20.

``DrainingRequestHandler`` closes such a connection as its task starts, before any request was
read: the agent sees it closed at once, nothing of it was decided, and it may send again (to
another replica, or to this one once restarted). A connection with a request under way drains
as before. It reads aiohttp's ``_close`` flag: tests/gate/test_shutdown.py fails if an upgrade
renames it.
"""

from __future__ import annotations

from aiohttp import web


class DrainingRequestHandler(web.RequestHandler):
    async def start(self) -> None:
        if self._close:  # marked closing before its first turn: no request was read
            self.force_close()
            return
        await super().start()
