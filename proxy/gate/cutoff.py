"""Claims cut off before anything left: remembered in the process, released as ``not_sent``
once the store answers again.

A claim whose statement failed with the connection (StoreUnavailable: a lost connection, a
commit that a missing synchronous standby never acknowledged, a failover) may still have
committed, on the old primary or on the standby that takes over. The request did not leave:
the pipeline answered 503 "nothing was sent". Left alone, the row stays ``dispatched`` until its
lease expires and reconciliation finds nothing at the provider: for a provider that does not
deduplicate, the approval ends ``failed`` though nothing was ever sent (measured: 22 burned
approvals in 10 failovers).

So the pipeline remembers each cut-off claim here (operation, the attempt it would have made,
and the claim's own lease owner), and a task of this process retries, with a short backoff,
until the store acknowledges ``end_attempt`` as ``not_sent`` for exactly that attempt under
exactly that owner (queries.sql; a claim that never committed matches no row). The owner is
unique per claim (:func:`claim_owner`): another request of this same process may hold the
operation's next attempt and be sending it, and must never be released as unsent.

Memory only: a process that dies with claims remembered leaves them to reconciliation, as
before. A release whose commit was not acknowledged is tried again; the second try then
matches nothing if the first had committed, and the memory is dropped: logged
``claim_cut_off_release_unconfirmed`` (released by the earlier try, or never committed), never
``claim_cut_off_never_committed``, which is said only when no try could have released it.
The pending claims' releases are tried together, each round: a burst of cut-off claims costs
one statement timeout while the store hangs, not one each. A reconciliation that read the row
before a release cannot settle it ``failed`` after (queries.sql ``settle_reconciled``,
``unchanged_since``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from proxy.errors import StoreUnavailable

_log = structlog.get_logger("opgate.gate")

_FIRST_RETRY_SECONDS = 0.1
_MAX_RETRY_SECONDS = 2.0


def claim_owner(instance_id: str) -> str:
    """A lease owner of this claim alone: the instance, and a token."""
    return f"{instance_id}#{secrets.token_hex(6)}"


@dataclass(frozen=True)
class CutOffClaim:
    """A claim whose statement failed with the connection."""

    operation_id: str
    attempt: int  # the attempt the claim would have made
    owner: str  # the claim's lease owner (claim_owner)


# True: the claim had committed and is now released; False: it had not (nothing to release).
Release = Callable[[CutOffClaim], Awaitable[bool]]


class CutOffClaims:
    """The cut-off claims of this process and the task that releases them."""

    def __init__(self) -> None:
        self._pending: dict[CutOffClaim, Release] = {}
        self._unanswered: set[CutOffClaim] = set()  # a release try raised: it may have committed
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def remember(self, claim: CutOffClaim, release: Release) -> None:
        """Keep ``claim`` until ``release`` (StoreUnavailable: not yet) has been acknowledged."""
        self._pending[claim] = release
        _log.warning(
            "claim_cut_off",
            operation_id=claim.operation_id,
            attempt=claim.attempt,
            note="nothing was sent; released as not_sent once the store answers",
        )
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._release_all())

    async def close(self) -> None:
        """Stop trying (at shutdown); what is left is reconciliation's, as before."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pending:
            _log.warning("claim_cut_off_left", claims=len(self._pending))

    async def _release_all(self) -> None:
        wait = _FIRST_RETRY_SECONDS
        while self._pending:
            self._wake.clear()
            # Together, not one after another: while a standby is away every release waits a
            # whole statement timeout, and a burst of cut-off claims would take that many.
            batch = list(self._pending.items())
            results = await asyncio.gather(
                *(release(claim) for claim, release in batch), return_exceptions=True
            )
            for (claim, _), result in zip(batch, results, strict=True):
                if isinstance(result, StoreUnavailable):
                    self._unanswered.add(claim)  # that try may have committed
                    continue
                if isinstance(result, BaseException):
                    # a bug must not stop the others; the lease then expires
                    _log.error(
                        "claim_cut_off_release_failed",
                        operation_id=claim.operation_id,
                        exc_info=result,
                    )
                else:
                    _log.info(
                        self._what_happened(claim, committed=result),
                        operation_id=claim.operation_id,
                        attempt=claim.attempt,
                    )
                self._unanswered.discard(claim)
                del self._pending[claim]
            if not self._pending:
                return
            # Backoff while the store is away; a new cut-off claim tries again at once.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            wait = min(wait * 2, _MAX_RETRY_SECONDS)

    def _what_happened(self, claim: CutOffClaim, *, committed: bool) -> str:
        """The log's word for a release's answer. Nothing found after a try whose answer never
        came: that try may have released it, or the claim never committed; which, the store
        no longer says (the release clears the lease's owner)."""
        if committed:
            return "claim_cut_off_released"
        if claim in self._unanswered:
            return "claim_cut_off_release_unconfirmed"
        return "claim_cut_off_never_committed"
