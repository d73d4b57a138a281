"""The operations API: the application's approval step creates, reads and revokes operations.

A separate listener from the agents', behind the admin bearer token. Agent tokens are not
admin tokens, so an agent can never approve its own work.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qsl

import structlog
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.admin.access import Approver, admin_problem, admin_token_matches, approver_for
from proxy.errors import AlreadySuperseded, IdempotencyKeyInUse, StoreUnavailable
from proxy.gate.bodies import BodyRejected, parse_json_object
from proxy.gate.budgets import budget_standings, remaining_budget, x402_standings
from proxy.gate.decision import Deny
from proxy.gate.identity import credential_from
from proxy.gate.ids import IdKind, id_rule, path_operation_id, reserved_prefix
from proxy.gate.reasons import REASONS, Reason
from proxy.operations.approvals import (
    OperationRequest,
    holds_nul,
    plan_operation,
    same_approval,
    supersession_problem,
)
from proxy.operations.audit_api import add_audit_routes
from proxy.recovery.api import recovery_view, recovery_views
from proxy.recovery.reconcile import reconcile_now
from proxy.runtime import GATEWAY, Gateway
from proxy.store.operation import STATUS_FILTERS, Status
from proxy.store.store import ApprovalKeyScope

_log = structlog.get_logger("opgate.ops")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# /metrics: counts only, no identifiers; a scraper must not need the admin token (docs/audit.md).
_PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
# The web console (proxy/console/) signs its humans in itself: a session cookie, not a bearer
# token (a browser cannot send one), with its own roles and CSRF checks.
_CONSOLE_PREFIX = "/console/"
_PROPOSALS = "/v1/proposals"
# Who decides a proposal on this request (the admin, or an approver by its token).
APPROVER = web.RequestKey("opgate_approver", Approver)


class RevokeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    reason: str = Field(min_length=1, max_length=1000)


@web.middleware
async def require_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _PUBLIC_PATHS or request.path.startswith(_CONSOLE_PREFIX):
        return await handler(request)
    values = request.headers.getall("Authorization", [])
    presented = credential_from(values[0]) if len(values) == 1 else None
    settings = request.app[GATEWAY].settings
    if request.path == _PROPOSALS or request.path.startswith(_PROPOSALS + "/"):
        # proposals are decided by the admin or an approver, who is who the token says
        approver = approver_for(presented, settings)
        if approver is not None:
            request[APPROVER] = approver
            return await handler(request)
    elif admin_token_matches(presented, settings.admin_token_sha256):
        return await handler(request)
    _log.warning("ops_unauthorized", path=request.path, method=request.method)
    response = admin_problem(401, "admin_unauthenticated", "an admin bearer token is required")
    response.headers["WWW-Authenticate"] = 'Bearer realm="opgate-operations"'
    return response


@web.middleware
async def body_in_time(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Read the whole body within ``body_read_timeout_seconds`` before the handler runs (aiohttp
    keeps it for ``request.read()``): a body trickling in cannot hold the API's connections."""
    if request.body_exists:
        seconds = request.app[GATEWAY].settings.body_read_timeout_seconds
        try:
            async with asyncio.timeout(seconds):
                await request.read()
        except TimeoutError:
            late = admin_problem(408, "body_timeout", f"the body did not arrive within {seconds} s")
            late.force_close()  # the rest of it is not waited for either
            return late
        except web.HTTPRequestEntityTooLarge:  # aiohttp's text/plain, as a problem
            # (aiohttp's client_max_size: 1 MiB; no approval or proposal comes near it)
            large = admin_problem(
                413, Reason.BODY_TOO_LARGE.value, "the body is larger than the API accepts (1 MiB)"
            )
            large.force_close()  # the rest of it is not read
            return large
    return await handler(request)


@web.middleware
async def store_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except StoreUnavailable as exc:
        return admin_problem(503, "store_unavailable", str(exc))


class BadInput(Exception):
    """A request the operations API cannot read one way: answered 400 with its code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code


@web.middleware
async def bad_input(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadInput as exc:
        return admin_problem(400, exc.code, str(exc))


async def read_document(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, parsed as strictly as an agent's (no duplicated key, bounded
    nesting, numbers kept exactly) and holding no NUL, which PostgreSQL can store neither in
    text nor in jsonb."""
    try:
        document = parse_json_object(await request.read())
    except BodyRejected as exc:
        raise BadInput("invalid_request", str(exc)) from exc
    if holds_nul(document):
        raise BadInput("invalid_request", "text may not hold a NUL character")
    return document


def operation_id_of(request: web.Request) -> str:
    """The path's operation id, strictly decoded; BadInput if no operation can have it."""
    operation_id = path_operation_id(request)
    if operation_id is None:
        raise BadInput(Reason.OPERATION_ID_INVALID.value, id_rule(IdKind.OPERATION))
    return operation_id


def query_of(request: web.Request) -> dict[str, str]:
    """The query, decoded strictly: a name given twice, bytes that are not UTF-8 (yarl would
    keep them as literal escapes) or a NUL is BadInput, not a filter that matches nothing."""
    try:
        pairs = parse_qsl(request.rel_url.raw_query_string, keep_blank_values=True, errors="strict")
    except UnicodeDecodeError as exc:
        raise BadInput("invalid_request", "the query is not UTF-8") from exc
    query = dict(pairs)
    if len(query) != len(pairs) or holds_nul(query):
        raise BadInput("invalid_request", "a query parameter is repeated or holds a NUL")
    return query


# The IETF httpapi Idempotency-Key draft: the value is a Structured Field String (RFC 8941),
# e.g. "8e03978e-40d5"; a bare value (as many clients send) is read as the same key.
_SF_STRING = re.compile(r'"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"')
_BARE_KEY = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")
_SF_ESCAPE = re.compile(r'\\(["\\])')
# Whose keys these are: /v1/operations takes the admin token only (require_admin).
_KEY_CALLER = "admin"


def request_key_of(request: web.Request) -> str | None:
    """The application's ``Idempotency-Key``, or None without one; BadInput if it is sent twice
    or is not a string of 1-255 printable ASCII characters."""
    values = request.headers.getall("Idempotency-Key", [])
    if not values:
        return None
    if len(values) > 1:
        raise BadInput("invalid_request", "Idempotency-Key is sent more than once")
    quoted = _SF_STRING.fullmatch(values[0])
    if quoted is not None:
        key = _SF_ESCAPE.sub(r"\1", quoted.group(1))
    else:
        key = values[0] if _BARE_KEY.fullmatch(values[0]) else ""
    if not 1 <= len(key) <= 255:
        raise BadInput(
            "invalid_request",
            "Idempotency-Key is a string of 1-255 printable ASCII characters",
        )
    return key


def approval_fingerprint(approval: OperationRequest) -> str:
    """What a key's repeat must ask for again: the approval as validated (so the order of its
    members, or a default spelled out, makes no difference), in canonical JSON, hashed."""
    canonical = json.dumps(
        approval.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


async def _keyed_repeat(
    gateway: Gateway, key: ApprovalKeyScope, fingerprint: str
) -> web.Response | None:
    """The answer to an approval whose key made an operation already: that operation (200) for
    the same approval, 422 for another; None if the key made nothing yet."""
    made = await gateway.store.approval_key(key)
    if made is None:
        return None
    if made.fingerprint != fingerprint:
        reason = Reason.IDEMPOTENCY_KEY_REUSED
        return admin_problem(
            REASONS[reason].status,
            reason.value,
            "this Idempotency-Key made an operation from another approval",
        )
    existing = await gateway.store.load(made.operation_id)
    assert existing is not None  # approval_keys references operations
    return web.json_response(existing.to_public(), status=200)


async def create_operation(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    request_key = request_key_of(request)
    try:
        approval = OperationRequest.model_validate(await read_document(request))
    except ValidationError as exc:
        return admin_problem(400, "invalid_request", "the approval is invalid", errors=_errors(exc))
    reserved = None if approval.operation_id is None else reserved_prefix(approval.operation_id)
    if reserved is not None:
        return admin_problem(400, Reason.OPERATION_ID_RESERVED.value, reserved)
    # An approval answered 503 may exist (its commit's answer lost): its retry under the same
    # key answers that operation instead of approving the intent a second time.
    key = (
        None if request_key is None else ApprovalKeyScope(approval.tenant, _KEY_CALLER, request_key)
    )
    fingerprint = approval_fingerprint(approval)
    if key is not None and (repeat := await _keyed_repeat(gateway, key, fingerprint)):
        return repeat
    planned = plan_operation(approval, gateway.policy, datetime.now(UTC))
    if isinstance(planned, list):
        return admin_problem(422, "approval_not_sendable", "; ".join(planned), errors=planned)
    if planned.supersedes is not None:
        refused = supersession_problem(planned, await gateway.store.load(planned.supersedes))
        if refused is not None:
            return admin_problem(409, "supersession_refused", refused)
    room = (
        []
        if planned.amount is None
        else await remaining_budget(
            gateway.store,
            gateway.policy,
            planned.provider,
            planned.tenant,
            planned.agent_id,
            planned.currency,
            planned.amount,
        )
    )
    if isinstance(room, Deny):  # advisory: the claim is what holds the budget
        existing = await gateway.store.load(planned.operation_id)
        if existing is not None and same_approval(planned, existing):
            return web.json_response(existing.to_public(), status=200)  # a repeat, as below
        return admin_problem(403, room.reason.value, room.detail, **(room.extra or {}))
    try:
        if key is None:
            created = await gateway.store.create(planned, actor="admin")
        else:
            created = await gateway.store.create_keyed(planned, "admin", key, fingerprint)
    except IdempotencyKeyInUse:
        # A concurrent create of this same approval can trip the key's unique index before the
        # id's ON CONFLICT: that is a repeat, answered with the row like any other repeat.
        if key is not None and (repeat := await _keyed_repeat(gateway, key, fingerprint)):
            return repeat  # its twin under the same Idempotency-Key, committed first
        existing = await gateway.store.load(planned.operation_id)
        if existing is not None and same_approval(planned, existing):
            return web.json_response(existing.to_public(), status=200)
        return admin_problem(
            409, "idempotency_key_in_use", "another operation of this provider holds that key"
        )
    except AlreadySuperseded:
        return admin_problem(
            409, "supersession_refused", f"{planned.supersedes} is already superseded"
        )
    if created is not None:
        _log.info("operation_created", operation_id=created.operation_id, action=created.action)
        return web.json_response(created.to_public(), status=201)
    # a twin with this key committed first (it waited for that commit, then found the key)
    if key is not None and (repeat := await _keyed_repeat(gateway, key, fingerprint)):
        return repeat
    existing = await gateway.store.load(planned.operation_id)
    if existing is not None and same_approval(planned, existing):
        return web.json_response(existing.to_public(), status=200)
    return admin_problem(
        409, "operation_exists", f"{planned.operation_id} exists with a different approval"
    )


async def get_operation(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    op = await gateway.store.load(operation_id_of(request))
    if op is None:
        return admin_problem(404, "operation_unknown", "no such operation")
    public = op.to_public()
    [view] = await recovery_views(gateway, [op])  # what a replacement agent would be told
    public["next_action"] = view["next_action"]
    public["reason"] = view["reason"]
    public["retry_after_seconds"] = view["retry_after_seconds"]
    public["events"] = await gateway.store.events(op.operation_id)
    return web.json_response(public)


async def revoke_operation(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    operation_id = operation_id_of(request)
    try:
        revoke = RevokeRequest.model_validate(await read_document(request))
    except ValidationError as exc:
        return admin_problem(400, "invalid_request", "a reason is required", errors=_errors(exc))
    revoked = await gateway.store.revoke(operation_id, revoke.reason, actor="admin")
    if revoked is None:
        existing = await gateway.store.load(operation_id)
        if existing is None:
            return admin_problem(404, "operation_unknown", "no such operation")
        if existing.revoked_at is None:  # settled: nothing is left to stop, nothing un-sends
            return admin_problem(
                409,
                "operation_settled",
                f"{operation_id} is {existing.status.value}: nothing is left to stop, and "
                "revoking un-sends nothing",
            )
        return web.json_response(existing.to_public())  # revoking twice changes nothing
    _log.info("operation_revoked", operation_id=operation_id, nothing_sent=revoked.nothing_sent())
    return web.json_response(revoked.to_public())


class ResolveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    verdict: Literal["confirmed", "failed"]
    object_id: str | None = Field(default=None, min_length=1, max_length=255)
    note: str = Field(min_length=1, max_length=4000)
    decided_by: str = Field(min_length=1, max_length=256)


async def list_operations(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    query = query_of(request)
    wanted = query.get("status", "unsettled")
    if wanted not in STATUS_FILTERS:
        return admin_problem(
            400, "invalid_request", f"status must be one of {sorted(STATUS_FILTERS)}"
        )
    given = query.get("limit", "")
    limit = min(int(given), 1000) if given.isascii() and given.isdigit() else 100
    ops = await gateway.store.list_operations(
        query.get("tenant"), STATUS_FILTERS[wanted], None, limit
    )
    return web.json_response({"operations": await recovery_views(gateway, ops)})


async def reconcile_operation(request: web.Request) -> web.Response:
    """One reconciliation try now; answers the row and what a replacement agent should do."""
    gateway = request.app[GATEWAY]
    operation_id = operation_id_of(request)
    if await gateway.store.load(operation_id) is None:
        return admin_problem(404, "operation_unknown", "no such operation")
    op = await reconcile_now(gateway, operation_id)
    assert op is not None
    return web.json_response(recovery_view(gateway, op))


async def list_escalations(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    escalated = await gateway.store.escalated(query_of(request).get("tenant"), 1000)
    views = []
    for op in escalated:
        view = recovery_view(gateway, op)
        view["events"] = await gateway.store.events(op.operation_id)
        views.append(view)
    return web.json_response({"escalations": views})


async def resolve_operation(request: web.Request) -> web.Response:
    """A human verdict on a dispatched operation (normally an escalated one)."""
    gateway = request.app[GATEWAY]
    operation_id = operation_id_of(request)
    try:
        verdict = ResolveRequest.model_validate(await read_document(request))
    except ValidationError as exc:
        return admin_problem(400, "invalid_request", "the verdict is invalid", errors=_errors(exc))
    if verdict.verdict == "confirmed" and verdict.object_id is None:
        return admin_problem(
            400, "invalid_request", "a confirmed verdict names the provider object"
        )
    resolved = await gateway.store.resolve(
        operation_id,
        Status(verdict.verdict),
        verdict.object_id,
        verdict.note,
        actor=f"human:{verdict.decided_by}",
    )
    if resolved is None:
        existing = await gateway.store.load(operation_id)
        if existing is None:
            return admin_problem(404, "operation_unknown", "no such operation")
        return admin_problem(
            409,
            "not_resolvable",
            f"{operation_id} is {existing.status.value}"
            + (" with an attempt in flight" if existing.lease_is_live() else ""),
        )
    _log.info("operation_resolved", operation_id=operation_id, verdict=verdict.verdict)
    return web.json_response(recovery_view(gateway, resolved))


async def list_budgets(request: web.Request) -> web.Response:
    """Every budget of the loaded policy and what is left of it now (advisory), per tenant or
    agent for those scopes: the keys that spent anything in the window, or the one asked for
    (``?tenant=``, ``&agent_id=``); and the same of the policy set's x402 limits (``x402``)."""
    gateway = request.app[GATEWAY]
    query = query_of(request)
    wanted = query.get("provider")
    providers = [p for p in gateway.policy.providers if wanted in (None, p.provider)]
    tenant, agent_id = query.get("tenant"), query.get("agent_id")
    found = await budget_standings(gateway.store, providers, tenant=tenant, agent_id=agent_id)
    x402 = await x402_standings(
        gateway.store, gateway.policy.x402_limits, tenant=tenant, agent_id=agent_id
    )
    return web.json_response(
        {
            "budgets": [standing.to_public() for standing in found],
            "x402": [standing.to_public() for standing in x402],
        }
    )


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        # a commit, acknowledged as a claim's must be (a read said 200 while claims hung), on
        # readiness's own connection within its budget, whatever holds the pool
        replication = await gateway.store.readiness(
            accept_async=gateway.settings.accept_async_replication,
            commit_timeout_seconds=gateway.settings.readiness_commit_timeout_seconds,
            budget_seconds=gateway.settings.readiness_budget_seconds,
        )
    except StoreUnavailable as exc:
        return web.json_response({"status": "unavailable", "detail": str(exc)}, status=503)
    if not replication.ready:
        return web.json_response({"status": "unavailable", "detail": replication.note}, status=503)
    # Every request must leave its audit record: a process whose writer cannot store them
    # takes no more traffic until it can.
    problem = gateway.observability.audit_writer_problem() if gateway.observability else None
    if problem is not None:
        return web.json_response({"status": "unavailable", "detail": problem}, status=503)
    return web.json_response(
        {
            "status": "ready",
            "policy_version": gateway.policy.version,
            "replication": replication.durability.value,
            "replication_note": replication.note,
        }
    )


def _errors(exc: ValidationError) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in err['loc']) or '(body)'}: {err['msg']}"
        for err in json.loads(exc.json())
    ]


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/operations", create_operation)
    app.router.add_get("/v1/operations", list_operations)
    app.router.add_get("/v1/escalations", list_escalations)
    app.router.add_post("/v1/operations/{operation_id}/reconcile", reconcile_operation)
    app.router.add_post("/v1/operations/{operation_id}/resolve", resolve_operation)
    app.router.add_get("/v1/operations/{operation_id}", get_operation)
    app.router.add_post("/v1/operations/{operation_id}/revoke", revoke_operation)
    app.router.add_get("/v1/budgets", list_budgets)
    add_audit_routes(app)  # /v1/audit/...: the transparency log for reviewers
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
