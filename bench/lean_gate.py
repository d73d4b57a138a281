"""The lean durable gate: the reference for what the durable work of opgate's row (b) costs
when it is written as directly as possible, with none of opgate's structure.

It serves ``POST <prefix>/v1/refunds`` (a form body ``amount``, ``currency``, ``charge``) for one
agent and does, per request, the same durable work as opgate's approved operation:

1. the agent's bearer token, compared by its SHA-256; ``X-Operation-Id`` names the operation;
2. ONE conditional ``UPDATE operations ... RETURNING idempotency_key`` that claims the row
   (``created -> dispatched``, with a lease) only if it is not revoked, not expired, of this
   agent and tenant, for this provider and rule, and its amount, currency and charge equal the
   form's: the checks are the claim's WHERE clause, committed (autocommit) before a byte leaves.
   Only when it claims nothing does a second statement read the row, to say why (the cold path);
3. forwards to the provider with the provider's credential, the operation id and the idempotency
   key injected (``X-Operation-Id`` and ``Idempotency-Key`` headers, the
   ``metadata[operation_id]`` form field), the body re-serialised from what was checked;
4. ONE statement that settles the row from the answer (2xx confirmed, 400/402/404 failed;
   anything else or no answer leaves it dispatched and releases the lease) and appends ONE
   audit record, SHA-256 chained to the previous record of its stream, in the same transaction.

Every request leaves exactly one audit record (a refused one too). The chain is real: each
record's hash is ``sha256(prev_hash || int8send(seq) || record)``, computed by PostgreSQL from
the head row it advances, and ``bench/run.py`` verifies every link after the row. There is one
stream per database connection (``lean/<backend pid>``), so no statement waits on another
connection's head row lock: a single global chain would hold one lock across every commit and
serialise the settles on the WAL flush. (opgate chains per operation and per instance.)

What it leaves out, on purpose, because it is opgate's structure and not the durable work: the
policy files and their routing, the second and third audit records per request (opgate writes
one per transition and one per request), the event rows, the load before the claim, structlog
lines, metrics, tracing, re-sends, reconciliation. It imports nothing from opgate; the
``operations`` table is opgate's (created by opgate's migrations in the bench database), its two
audit tables are its own (created at start if absent).

Run as ``python bench/lean_gate.py --port PORT --database-url URL --upstream URL
--agent-token-sha256 HEX`` with the provider's credential in ``LEAN_GATE_CREDENTIAL``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import re
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

CREATE_TABLES = """
CREATE TABLE IF NOT EXISTS lean_audit_heads (
    stream    text   PRIMARY KEY,
    seq       bigint NOT NULL,
    prev_hash bytea  NOT NULL,
    hash      bytea  NOT NULL
);
CREATE TABLE IF NOT EXISTS lean_audit (
    stream       text        NOT NULL,
    seq          bigint      NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    operation_id text,
    record       text        NOT NULL,
    prev_hash    bytea       NOT NULL,
    hash         bytea       NOT NULL,
    PRIMARY KEY (stream, seq)
);
"""

# The connection's own stream: created once per connection, continued if a later backend has
# the same pid (the head row is the chain's state, whoever advances it).
OPEN_STREAM = """
INSERT INTO lean_audit_heads (stream, seq, prev_hash, hash)
VALUES ('lean/' || pg_backend_pid(), 0, decode(repeat('00', 32), 'hex'),
        decode(repeat('00', 32), 'hex'))
ON CONFLICT (stream) DO NOTHING
"""

# The claim: every check opgate makes on an approved operation, as the UPDATE's condition.
CLAIM = """
UPDATE operations
   SET status = 'dispatched', attempts = attempts + 1, dispatched_at = now(),
       lease_owner = $2, lease_until = now() + make_interval(secs => $3), updated_at = now()
 WHERE operation_id = $1 AND status = 'created' AND revoked_at IS NULL AND expires_at > now()
   AND tenant = $4 AND (agent_id IS NULL OR agent_id = $5) AND provider = $6
   AND action = 'refund.create' AND method = 'POST' AND path = '/v1/refunds'
   AND amount = $7 AND currency = $8 AND params = jsonb_build_object('charge', $9::text)
RETURNING idempotency_key
"""

# Only after a claim that matched nothing: why (the refusal's reason), never on the hot path.
EXPLAIN_REFUSAL = """
SELECT status, revoked_at IS NOT NULL AS revoked, expires_at <= now() AS expired, tenant,
       agent_id, provider, action, method, path, amount, currency, params ->> 'charge' AS charge
  FROM operations WHERE operation_id = $1
"""

# Advances this connection's stream head and appends the record it hashes ($2), if $1 is true.
_APPEND = """
head AS (
    UPDATE lean_audit_heads h
       SET seq = h.seq + 1, prev_hash = h.hash,
           hash = sha256(h.hash || int8send(h.seq + 1) || convert_to($2, 'UTF8'))
     WHERE h.stream = 'lean/' || pg_backend_pid() AND {condition}
    RETURNING h.stream, h.seq, h.prev_hash, h.hash
)
INSERT INTO lean_audit (stream, seq, operation_id, record, prev_hash, hash)
SELECT stream, seq, $1, $2, prev_hash, hash FROM head
RETURNING seq
"""

# The settle and its audit record, one statement, one transaction.
SETTLE = """
WITH settled AS (
    UPDATE operations
       SET status = $3, last_outcome = $3, provider_status = $4, provider_object_id = $5,
           response_content_type = $6, response_body = $7, settled_at = now(),
           settled_reason = 'provider_answer', attempt_ended_at = now(),
           lease_owner = NULL, lease_until = NULL, updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched' AND lease_owner = $8
    RETURNING operation_id
),""" + _APPEND.format(condition="EXISTS (SELECT FROM settled)")

# No conclusive answer: the row STAYS dispatched (the send may have had an effect), the lease is
# released, and the request's audit record says so.
RELEASE = """
WITH released AS (
    UPDATE operations
       SET lease_owner = NULL, lease_until = NULL, last_outcome = $3, attempt_ended_at = now(),
           updated_at = now()
     WHERE operation_id = $1 AND status = 'dispatched' AND lease_owner = $4
    RETURNING operation_id
),""" + _APPEND.format(condition="EXISTS (SELECT FROM released)")

# A refused request's record (nothing claimed, nothing sent).
AUDIT_ONLY = "WITH " + _APPEND.format(condition="true")

_OPERATION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_AMOUNT = re.compile(r"^[0-9]{1,18}$")
_FORM = "application/x-www-form-urlencoded"
_FIELDS = ("amount", "currency", "charge")
_METADATA_FIELD = "metadata[operation_id]"
_FAILED = frozenset({400, 402, 404})


@dataclass(frozen=True)
class Agent:
    agent_id: str
    tenant: str
    token_sha256: str


@dataclass(frozen=True)
class Config:
    upstream: str
    provider: str
    route_prefix: str
    agent: Agent
    credential: str
    instance: str
    lease_seconds: float
    total_timeout: float


CONFIG = web.AppKey("config", Config)
POOL = web.AppKey("pool", asyncpg.Pool)
CLIENT = web.AppKey("client", aiohttp.ClientSession)


class Refused(Exception):
    """A request refused before anything was claimed: a status and a stable code."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


def parse_form(body: bytes) -> dict[str, str]:
    """The form's three fields, strictly: UTF-8, no duplicate or unknown field, no NUL (text
    columns refuse it), an integer amount, and no ``metadata[operation_id]`` of the agent's."""
    try:
        pairs = urllib.parse.parse_qsl(
            body.decode("utf-8"), keep_blank_values=True, strict_parsing=True, errors="strict"
        )
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, "request_malformed", f"unreadable form body: {exc}") from exc
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise Refused(400, "request_malformed", f"duplicate form field {name!r}")
        if name == _METADATA_FIELD:
            raise Refused(400, "injection_conflict", f"{name} is set by the gate")
        if name not in _FIELDS:
            raise Refused(400, "request_malformed", f"unexpected form field {name!r}")
        if "\x00" in value:
            raise Refused(400, "request_malformed", f"NUL in form field {name!r}")
        fields[name] = value
    missing = [name for name in _FIELDS if name not in fields]
    if missing:
        raise Refused(400, "request_malformed", f"missing form fields {missing}")
    if not _AMOUNT.match(fields["amount"]):
        raise Refused(400, "request_malformed", "amount is not a non-negative integer")
    return fields


def refusal_of(row: asyncpg.Record | None, config: Config, fields: dict[str, str]) -> Refused:
    """Why a claim matched nothing, from the row as it is now (first failing check wins)."""
    agent = config.agent
    if row is None:
        return Refused(404, "operation_not_found", "no such operation")
    if row["tenant"] != agent.tenant or row["agent_id"] not in (None, agent.agent_id):
        return Refused(404, "operation_not_found", "no such operation")  # never confirm others'
    if row["revoked"]:
        return Refused(409, "operation_revoked", "the approval was revoked")
    if row["expired"]:
        return Refused(409, "operation_expired", "the approval has expired")
    if row["status"] != "created":
        return Refused(409, "operation_not_sendable", f"the operation is {row['status']}")
    if (row["provider"], row["action"], row["method"], row["path"]) != (
        config.provider,
        "refund.create",
        "POST",
        "/v1/refunds",
    ):
        return Refused(422, "operation_mismatch", "the operation is for another request")
    for name, approved in (
        ("amount", str(row["amount"])),
        ("currency", row["currency"]),
        ("charge", row["charge"]),
    ):
        if fields[name] != approved:
            return Refused(422, f"{name}_mismatch", f"{name} differs from the approval")
    return Refused(409, "claim_conflict", "the operation changed while it was being claimed")


def audit_record(**fields: Any) -> str:
    """The record's text, as hashed: compact JSON with the gate's clock in microseconds."""
    return json.dumps({"time_us": time.time_ns() // 1000, **fields}, separators=(",", ":"))


def problem(refusal: Refused) -> web.Response:
    body = {"type": "about:blank", "status": refusal.status, "code": refusal.code}
    return web.Response(
        status=refusal.status,
        text=json.dumps(body | {"detail": refusal.detail}),
        content_type="application/problem+json",
    )


def object_id_of(body: bytes) -> str | None:
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    value = answer.get("id") if isinstance(answer, dict) else None
    return value if isinstance(value, str) and "\x00" not in value else None


async def create_refund(request: web.Request) -> web.Response:
    config, pool = request.app[CONFIG], request.app[POOL]
    operation_id = request.headers.get("X-Operation-Id", "")
    base: dict[str, str] = {}  # the agent's id and tenant, once its token is known
    try:
        return await _gate(request, config, pool, operation_id, base)
    except Refused as refusal:
        record = audit_record(
            **base, operation_id=operation_id or None, decision="deny", reason=refusal.code
        )
        async with pool.acquire() as conn:
            await conn.fetchval(AUDIT_ONLY, operation_id or None, record)
        return problem(refusal)


async def _gate(
    request: web.Request,
    config: Config,
    pool: asyncpg.Pool,
    operation_id: str,
    base: dict[str, str],
) -> web.Response:
    token = request.headers.get("Authorization", "").removeprefix("Bearer ")
    digest = hashlib.sha256(token.encode()).hexdigest()
    if not hmac.compare_digest(digest, config.agent.token_sha256):
        raise Refused(401, "agent_unauthenticated", "unknown agent token")
    base |= {"agent_id": config.agent.agent_id, "tenant": config.agent.tenant}
    if not _OPERATION_ID.match(operation_id):
        raise Refused(400, "operation_id_invalid", "X-Operation-Id is missing or malformed")
    if request.content_type != _FORM:
        raise Refused(415, "request_malformed", f"the body must be {_FORM}")
    fields = parse_form(await request.read())

    # The claim, committed before anything is sent.
    agent = config.agent
    async with pool.acquire() as conn:
        key = await conn.fetchval(
            CLAIM, operation_id, config.instance, config.lease_seconds + config.total_timeout,
            agent.tenant, agent.agent_id, config.provider, int(fields["amount"]),
            fields["currency"], fields["charge"],
        )  # fmt: skip
        if key is None:
            raise refusal_of(await conn.fetchrow(EXPLAIN_REFUSAL, operation_id), config, fields)

    outbound = urllib.parse.urlencode([*fields.items(), (_METADATA_FIELD, operation_id)]).encode()
    headers = {
        "Authorization": f"Bearer {config.credential}",
        "Content-Type": _FORM,
        "Idempotency-Key": key,
        "X-Operation-Id": operation_id,
    }
    record = base | {
        "operation_id": operation_id,
        "decision": "allow",
        "forwarded_body_sha256": hashlib.sha256(outbound).hexdigest(),
    }
    # Once claimed, the outcome is recorded even if the agent hangs up.
    return await asyncio.shield(
        _forward_and_settle(request.app, operation_id, outbound, headers, record)
    )


async def _forward_and_settle(
    app: web.Application,
    operation_id: str,
    outbound: bytes,
    headers: dict[str, str],
    record: dict[str, Any],
) -> web.Response:
    config, pool = app[CONFIG], app[POOL]
    status: int | None = None
    # POST is not an idempotent method: aiohttp never re-sends it on its own.
    try:
        async with app[CLIENT].post(
            config.upstream + "/v1/refunds",
            data=outbound,
            headers=headers,
            allow_redirects=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=config.total_timeout, sock_connect=5),
        ) as answer:
            body, content_type = await answer.read(), answer.headers.get("Content-Type")
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        body, content_type = b"", None
        outcome = f"unknown:{type(exc).__name__}"
    else:
        outcome = "confirmed" if 200 <= status < 300 else "failed" if status in _FAILED else ""
        if not outcome:
            outcome = f"unknown:http_{status}"

    async with pool.acquire() as conn:
        if outcome in ("confirmed", "failed"):
            object_id = object_id_of(body) if outcome == "confirmed" else None
            text = audit_record(
                **record, status_after=outcome, provider_status=status, object_id=object_id
            )
            seq = await conn.fetchval(
                SETTLE, operation_id, text, outcome, status, object_id, content_type, body,
                config.instance,
            )  # fmt: skip
        else:
            text = audit_record(**record, status_after="dispatched", outcome=outcome)
            seq = await conn.fetchval(RELEASE, operation_id, text, outcome, config.instance)
        if seq is None:  # the lease was lost (it cannot expire this fast): still one record
            text = audit_record(**record, decision="error", reason="settle_conflict")
            await conn.fetchval(AUDIT_ONLY, operation_id, text)
    if status is None:
        return problem(Refused(502, "upstream_unknown", "no answer from the provider"))
    return web.Response(
        status=status, body=body, headers={"Content-Type": content_type} if content_type else None
    )


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _reset(conn: asyncpg.Connection) -> None:
    """Instead of asyncpg's reset query (one extra round trip per request): this gate leaves no
    session state behind, only an interrupted transaction would need undoing."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


def lean_app(config: Config, database_url: str, pool_size: int) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[CONFIG] = config

    async def resources(app: web.Application) -> AsyncIterator[None]:
        setup = await asyncpg.connect(database_url)
        try:
            await setup.execute(CREATE_TABLES)
        finally:
            await setup.close()
        async with (
            asyncpg.create_pool(
                database_url,
                min_size=pool_size,
                max_size=pool_size,
                reset=_reset,
                init=lambda conn: conn.execute(OPEN_STREAM),
                server_settings={"application_name": "lean_gate"},
            ) as pool,
            aiohttp.ClientSession(
                auto_decompress=False,
                trust_env=False,
                connector=aiohttp.TCPConnector(limit=0),
                cookie_jar=aiohttp.DummyCookieJar(),
            ) as client,
        ):
            app[POOL], app[CLIENT] = pool, client
            yield

    app.cleanup_ctx.append(resources)
    app.router.add_post(config.route_prefix + "/v1/refunds", create_refund)
    app.router.add_get("/healthz", healthz)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--upstream", required=True, help="the provider's base URL")
    parser.add_argument("--agent-token-sha256", required=True)
    parser.add_argument("--agent-id", default="bench")
    parser.add_argument("--tenant", default="t1")
    parser.add_argument("--provider", default="bench")
    parser.add_argument("--route-prefix", default="/bench")
    parser.add_argument("--pool-size", type=int, default=10, help="as opgate's pool_max_size")
    args = parser.parse_args()
    credential = os.environ.get("LEAN_GATE_CREDENTIAL", "")
    if not credential:
        parser.error("LEAN_GATE_CREDENTIAL (the provider's credential) is not set")
    config = Config(
        upstream=args.upstream.rstrip("/"),
        provider=args.provider,
        route_prefix=args.route_prefix,
        agent=Agent(args.agent_id, args.tenant, args.agent_token_sha256),
        credential=credential,
        instance=f"lean/{os.getpid()}",
        lease_seconds=5.0,
        total_timeout=30.0,
    )
    # No access log: opgate's per-request line is its audit record, which this gate writes to
    # the database instead.
    web.run_app(
        lean_app(config, args.database_url, args.pool_size),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
    )


if __name__ == "__main__":
    main()
