"""The background work of an opgate process: reconciling dispatched operations whose attempt
is over, and delivering escalation notifications. Neither ever blocks an agent's request.

Every replica runs both loops; the database hands each row to one of them at a time
(``FOR UPDATE SKIP LOCKED`` plus a lease), so scaling out needs no coordination.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
import structlog

from proxy.errors import StoreUnavailable
from proxy.gate.upstream import new_client_session
from proxy.recovery.api import proposal_request
from proxy.recovery.reconcile import longest_lease_seconds, reconcile_claimed, reconcile_owner
from proxy.recovery.webhooks import (
    WEBHOOK_KEY_SECRET,
    WebhookKeyInvalid,
    signed_headers,
    webhook_key,
)
from proxy.runtime import Gateway

_log = structlog.get_logger("opgate.background")
_NOTIFY_LEASE_SECONDS = 30.0
_MAX_BACKOFF_SECONDS = 300.0
# What a notification tells the humans, by its kind (escalation_notifications.kind).
_EVENTS = {
    "escalated": "operation_escalated",
    "settled_by_provider": "operation_settled_by_provider",
    "proposal_pending": "proposal_pending",  # an agent's proposal waits for an approver
}


async def reconcile_pass(gw: Gateway, batch: int) -> int:
    """Reconcile one batch of due operations; returns how many were tried."""
    owner = reconcile_owner(gw, "loop")
    lease = longest_lease_seconds(gw.policy, gw.settings.lease_margin_seconds)
    claimed = await gw.store.claim_reconcile_batch(owner, lease, batch)
    # All at once: the batch's lease covers one try of each row's lookups, not a queue of them.
    results = await asyncio.gather(
        *(reconcile_claimed(gw, op, owner) for op in claimed), return_exceptions=True
    )
    for op, result in zip(claimed, results, strict=True):
        if isinstance(result, StoreUnavailable):
            raise result
        if isinstance(result, Exception):  # one bad row must not stop the loop; it returns
            _log.error("reconcile_failed", operation_id=op.operation_id, exc_info=result)
    return len(claimed)


async def notify_pass(gw: Gateway, http: aiohttp.ClientSession, url: str) -> int:
    """Deliver due escalation notifications (at least once; receivers dedupe on the id)."""
    due = await gw.store.claim_notifications(20, _NOTIFY_LEASE_SECONDS)
    for notification in due:
        payload = await _notice(gw, notification)
        if payload is None:
            continue
        subject = {"operation_id": notification["operation_id"]}
        if notification["proposal_id"] is not None:
            subject = {"proposal_id": notification["proposal_id"]}
        body = json.dumps(payload, default=str, allow_nan=False).encode("utf-8")
        # Read per notice, so a rotated key takes effect; without one nothing leaves unsigned:
        # the notice waits (with the reason on record) until a key is configured.
        secret = gw.credentials.secret(WEBHOOK_KEY_SECRET)
        try:
            key = webhook_key(secret) if secret else None
        except WebhookKeyInvalid as exc:
            key, problem = None, str(exc)
        else:
            problem = f"no {WEBHOOK_KEY_SECRET} secret: escalation notices are only sent signed"
        if key is None:
            await gw.store.notification_failed(
                notification["notification_id"], _MAX_BACKOFF_SECONDS, problem
            )
            _log.error("escalation_notify_unsigned_refused", **subject, error=problem)
            continue
        # the same id on every retry of a notice: the receiver deduplicates on it
        message_id = f"ntf_{notification['notification_id']}"
        try:
            async with http.post(
                url,
                data=body,
                headers={
                    "Content-Type": "application/json",
                    "X-Opgate-Notification-Id": str(notification["notification_id"]),
                    **signed_headers(key, message_id, int(time.time()), body),
                },
                timeout=aiohttp.ClientTimeout(total=10),
                allow_redirects=False,  # a redirect would post the notice to another place
            ) as response:
                if 200 <= response.status < 300:
                    await gw.store.notification_delivered(notification["notification_id"])
                    _log.info("escalation_notified", **subject)
                    continue
                error = f"webhook answered {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        backoff = min(_MAX_BACKOFF_SECONDS, 2.0 ** notification["attempts"])
        await gw.store.notification_failed(notification["notification_id"], backoff, error)
        _log.warning("escalation_notify_failed", **subject, error=error)
    return len(due)


async def _notice(gw: Gateway, notification: dict[str, Any]) -> dict[str, Any] | None:
    """The notice's body: the operation and its events, or the proposal waiting for an
    approver with the exact request an approval lets through (its view, as the console's)."""
    if notification["proposal_id"] is not None:
        proposal = await gw.store.load_proposal(notification["proposal_id"])
        if proposal is None:
            return None
        return {
            "notification_id": notification["notification_id"],
            "event": _EVENTS[notification["kind"]],
            "proposal": proposal.to_public(),
            "request": proposal_request(gw.policy, proposal),
        }
    op = await gw.store.load(notification["operation_id"])
    if op is None:
        return None
    return {
        "notification_id": notification["notification_id"],
        "event": _EVENTS[notification["kind"]],
        "operation": op.to_public(),
        "events": await gw.store.events(op.operation_id),
    }


async def run_background(gw: Gateway, stop: asyncio.Event) -> None:
    """Both loops until ``stop`` is set, every ``background_interval_seconds``, the first pass
    one interval after start (a starting replica does not race the requests it is about to
    serve); a database outage only delays them."""
    settings = gw.settings
    async with new_client_session() as http:
        while not await _stopped_within(stop, settings.background_interval_seconds):
            try:
                await reconcile_pass(gw, settings.reconcile_batch_size)
                if settings.escalation_webhook_url:
                    await notify_pass(gw, http, settings.escalation_webhook_url)
            except StoreUnavailable as exc:
                _log.warning("background_store_unavailable", error=str(exc))


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()
