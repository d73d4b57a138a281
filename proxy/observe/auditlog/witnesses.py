"""The client side of C2SP tlog-witness: each new checkpoint, with the consistency proof from
the last one a witness cosigned for us, is POSTed to ``<url>/add-checkpoint``; the cosignature
lines it answers are verified with its key and stored (``transparency_cosignatures``).

A witness that answers 409 knows another size for this log (it lost our last exchange, or
another process of ours got there first): the request is sent once more from that size. Any
other refusal is logged (``audit_witness_refused``, with the witness's status and reason):
a 422 means the witness holds a checkpoint of ours that the new one does not extend, which is
what a witness is for. No refusal stops the integrator.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from functools import partial

import aiohttp
import asyncpg
import structlog

from proxy.observe.auditlog import integrator
from proxy.settings import WitnessConfig
from proxy.store import transparency as tstore
from proxy.store.store import Store
from proxy.transparency import note
from proxy.transparency.witness import SIZE_CONTENT_TYPE, add_checkpoint_body

_log = structlog.get_logger("opgate.audit")
_TIMEOUT = aiohttp.ClientTimeout(total=10)


class Witnesses:
    """Asks each configured witness to cosign a new checkpoint, and keeps what they sign."""

    def __init__(self, store: Store, witnesses: Sequence[WitnessConfig]) -> None:
        self._store = store
        self._witnesses = [(w.url.rstrip("/"), note.Verifier.from_vkey(w.vkey)) for w in witnesses]
        self._session: aiohttp.ClientSession | None = None

    async def __call__(self, done: integrator.Integrated) -> None:
        if self._session is None:
            # opgate's own submissions (POST: aiohttp never re-sends them), not routed by the
            # environment's HTTP_PROXY
            self._session = aiohttp.ClientSession(timeout=_TIMEOUT, trust_env=False)
        for url, verifier in self._witnesses:
            try:
                await self._ask(self._session, url, verifier, done)
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                _log.warning("audit_witness_failed", witness=verifier.name, error=str(exc))

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(aiohttp.ClientError):
                await self._session.close()

    async def _ask(
        self,
        session: aiohttp.ClientSession,
        url: str,
        verifier: note.Verifier,
        done: integrator.Integrated,
    ) -> None:
        old = await self._store.run(lambda conn: tstore.witness_size(conn, verifier.name))
        for _ in range(2):
            if old > done.size:  # it cosigned a larger tree: a later round will catch up
                return
            proof = await self._store.run(partial(_consistency, old=old, new=done.size))
            body = add_checkpoint_body(old, proof, done.checkpoint)
            async with session.post(f"{url}/add-checkpoint", data=body.encode()) as response:
                answer = await response.text()
                if response.status == 409 and response.content_type == SIZE_CONTENT_TYPE:
                    old = int(answer.strip())
                    continue
                if response.status != 200:
                    _log.warning(
                        "audit_witness_refused",
                        witness=verifier.name,
                        status=response.status,
                        reason=answer[:200].strip(),
                        tree_size=done.size,
                    )
                    return
            await self._keep(verifier, done, answer)
            return

    async def _keep(self, verifier: note.Verifier, done: integrator.Integrated, lines: str) -> None:
        text = note.parse_note(done.checkpoint).text
        opened = note.open_note(text + "\n" + lines, [verifier])
        lines_kept = "".join(s.line() for s in opened.verified)
        await self._store.run(
            lambda conn: tstore.insert_cosignature(conn, done.size, verifier.name, lines_kept)
        )
        _log.info("audit_witnessed", witness=verifier.name, tree_size=done.size)


async def _consistency(conn: asyncpg.Connection, *, old: int, new: int) -> list[bytes]:
    return await integrator.consistency(conn, old, new)
