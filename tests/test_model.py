"""A model-based test of opgate's whole at-most-once promise, against real parts.

Two opgate replicas (in-process, one instance id each) share one real PostgreSQL, in front of
the fault-injecting provider. Seeded actors run for a bounded number of steps:

- one agent per approved operation, each step one of: send the exact approved request; send it
  in a burst to both replicas at once (claim races); or read
  ``GET /_opgate/v1/operations/{id}`` and do what ``next_action`` says, as a replacement agent
  would (send / retry: send ``request`` as given; wait / reconcile: ask again later; proceed /
  new_approval_required / escalated: stop, or now and then keep sending like a stubborn one);
- an admin revoking some approvals through the operations API; some approvals expire mid-run;
- the provider deciding, per operation and per arrival, to answer, refuse (``fail``: no effect),
  commit then answer 500 or drop the connection, stall (the attempt times out and its lease
  ends), commit then stall, or answer slowly; lookups (GET) suffer the same faults;
- a releaser letting stalled requests go at random moments;
- both replicas' background reconcilers, on seeded intervals (0.1 to 2 s), so that agents'
  re-sends race them.

Then the provider heals, the stalls are released, and the test waits (bounded, polling the rows)
until every operation is settled, escalated or never sent. Invariants, from the provider's
ground truth, the rows, their events and the audit log:

- at most one effect per operation (grouped by the injected operation id and by the key);
- ``confirmed`` only with that effect (its id), ``failed`` only without one, ``created`` only
  with nothing sent; every answer 2xx an agent got carries the operation's one effect;
- the provider saw at most one request per claimed attempt, each exactly the approved one, and
  no attempt was claimed after a revocation or a settlement;
- every agent request to a provider route left exactly one audit record, on the replica it
  reached, with the status the agent got; every claimed attempt has the record of the request
  that claimed it (recovery reads leave none yet: tests/observe/test_audit.py, xfail);
- what an agent was told by the recovery read holds: ``proceed`` only for what ends confirmed,
  ``new_approval_required`` only for what ends failed or never sent, and ``request`` is exactly
  the approved request;
- opgate never answered 500 (nor anything an exact approved request should not get), and logged
  no error.

Policies: the provider deduplicates and the policy says so (with and without lookups); it does
not and the policy says so (with and without lookups); and the policy WRONGLY says it does, with
lookups declared (the lookups answer: opgate asks before it re-sends). An inconclusive lookup
under a wrong claim does duplicate: tests/gate/test_resend.py reproduces it.

Reproduce a run with ``OPGATE_MODEL_SEED`` (printed in every failure; ``random`` picks one).
Length: ``OPGATE_MODEL_STEPS`` agent steps per policy (default 1000), or ``OPGATE_SOAK=1``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from structlog.testing import capture_logs

from proxy.observe.auditlog.records import request_stream
from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    PROVIDER_SECRET,
    Opgate,
    StartOpgate,
    admin_headers,
    fault_policy,
)

_seed_setting = os.environ.get("OPGATE_MODEL_SEED", "20261207")
SEED = random.randrange(2**32) if _seed_setting == "random" else int(_seed_setting)
SOAK = os.environ.get("OPGATE_SOAK") == "1"
STEPS = int(os.environ.get("OPGATE_MODEL_STEPS", "8000" if SOAK else "1000"))
STEPS_PER_OPERATION = 8  # on average: how many operations share the steps
# Agents arrive over this long; soaks spread the same density over more time.
ARRIVALS_SECONDS = 3.0 * max(1.0, STEPS / 1000)
# Bound on the wait for the background to settle or give up, once the load has stopped.
SETTLE_SECONDS = 30.0 + 10.0 * STEPS / 1000
REFUND = "/fault/v1/refunds"

# Timing of the policy and replicas: short, so that attempts time out and leases end often.
TOTAL_TIMEOUT = 0.4
LEASE_MARGIN = 0.05
GRACE = 0.3
SLOW = 0.3  # a slow answer: inside the timeout, most of the time

# Fault weights: what the provider does with one request.
POST_FAULTS = {
    FaultMode.OK: 4,
    FaultMode.FAIL: 1,
    FaultMode.ERROR_AFTER_COMMIT: 2,
    FaultMode.DROP_AFTER_COMMIT: 2,
    FaultMode.STALL: 2,
    FaultMode.STALL_AFTER_COMMIT: 1,
    FaultMode.SLOW: 1,
}
GET_FAULTS = {
    FaultMode.OK: 5,
    FaultMode.FAIL: 1,
    FaultMode.ERROR_AFTER_COMMIT: 1,
    FaultMode.DROP_AFTER_COMMIT: 1,
    FaultMode.STALL: 1,
    FaultMode.SLOW: 1,
}
# What an exact approved request may be answered, besides the provider's own 2xx and 402:
# refused by state (403 revoked/expired, 409 in flight/failed/reconcile/escalated), unknown
# outcome (502, 504), the store or pool saturated (503), the agent's own concurrency bound (429).
AGENT_STATUSES = {200, 402, 403, 409, 429, 502, 503, 504}


@dataclass(frozen=True)
class Policy:
    """What the provider does, and what the policy says about it."""

    name: str
    provider_deduplicates: bool
    policy_says_deduplicates: bool
    lookups: bool
    lookup_faults: bool = True
    total_timeout: float = TOTAL_TIMEOUT  # the provider's, for its sends and lookups alike


POLICIES = [
    Policy("deduplicating", True, True, lookups=True),
    Policy("deduplicating-no-lookups", True, True, lookups=False),
    Policy("not-deduplicating", False, False, lookups=True),
    Policy("not-deduplicating-no-lookups", False, False, lookups=False),
    # The lookups answer: opgate's own question, not the claim, decides the re-send. They must
    # answer in time, too: a lookup that times out is inconclusive, and then the (false) claim
    # that the provider deduplicates lets a re-send go, as documented. Every server of the
    # model shares one event loop, which a loaded machine has been seen to stall for longer
    # than 0.4 s, so this policy's timeout leaves room (its sends stall 2 s instead).
    Policy(
        "deduplication-wrongly-claimed",
        False,
        True,
        lookups=True,
        lookup_faults=False,
        total_timeout=2.0,
    ),
]


@dataclass
class ModelOperation:
    """One approved operation and the provider's plan for it."""

    index: int
    operation_id: str
    key: str
    charge: str
    amount: int
    post_modes: list[FaultMode]
    get_modes: list[FaultMode]
    arrival: float  # seconds after the start when its agent first acts
    posts_seen: int = 0
    gets_seen: int = 0

    @property
    def form(self) -> dict[str, str]:
        return {"amount": str(self.amount), "currency": "usd", "charge": self.charge}

    @property
    def approved_request(self) -> dict[str, Any]:
        """The request as the recovery read must give it."""
        return {
            "method": "POST",
            "path": REFUND,
            "headers": {"X-Operation-Id": self.operation_id, "Idempotency-Key": self.key},
            "form": self.form,
        }


@dataclass(frozen=True)
class Sent:
    """One agent request to a provider route, and what the agent got."""

    instance: str
    operation_id: str
    via: str
    status: int | None
    content_type: str | None
    body: bytes


@dataclass
class World:
    """The actors' shared view: the replicas, the plan, and everything that happened."""

    seed: int
    policy: Policy
    provider: FaultProvider
    gates: list[Opgate]
    http: aiohttp.ClientSession
    started: float = field(default_factory=time.monotonic)
    ops: list[ModelOperation] = field(default_factory=list)
    by_id: dict[str, ModelOperation] = field(default_factory=dict)
    by_charge: dict[str, ModelOperation] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    other_answers: list[tuple[str, int | None]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    refused_revokes: set[str] = field(default_factory=set)  # settled when revoked
    advised: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    retention: float = 0.0
    loops: tuple[float, float] = (0.0, 0.0)
    steps: int = 0
    healed: bool = False

    def note(self, line: str) -> None:
        self.trace.append(f"{time.monotonic() - self.started:7.3f} {line}")

    def instance(self, gate: Opgate) -> str:
        return gate.running.gateway.settings.instance_id

    # -- the provider's choices, per operation and per arrival (reproducible per seed) --
    def choose(self, request: web.Request) -> FaultMode | None:
        if self.healed:
            return FaultMode.OK
        if request.method == "POST":
            op = self.by_id.get(request.headers.get("X-Operation-Id", ""))
            if op is None:
                return FaultMode.OK  # the invariants name any request of no operation
            mode = _nth(op.post_modes, op.posts_seen)
            op.posts_seen += 1
        else:
            op = self.by_charge.get(request.query.get("charge", ""))
            if op is None:
                return FaultMode.OK
            mode = _nth(op.get_modes, op.gets_seen)
            op.gets_seen += 1
        self.note(f"provider {request.method} {op.operation_id} -> {mode}")
        return mode

    # -- actions --
    async def send(self, op: ModelOperation, gate: Opgate, via: str) -> Sent:
        status: int | None = None
        content_type: str | None = None
        body = b""
        try:
            async with self.http.post(
                gate.agent_url + REFUND,
                data=op.form,
                headers={
                    "Authorization": f"Bearer {AGENT_TOKEN}",
                    "X-Operation-Id": op.operation_id,
                    "Idempotency-Key": op.key,
                },
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response:
                status, content_type = response.status, response.content_type
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.violations.append(f"{op.operation_id}: {via} send got no answer: {exc!r}")
        sent = Sent(self.instance(gate), op.operation_id, via, status, content_type, body)
        self.sent.append(sent)
        self.note(f"agent {via} {op.operation_id} @{sent.instance} -> {status} {body[:90]!r}")
        return sent

    async def read(self, op: ModelOperation, gate: Opgate) -> dict[str, Any] | None:
        url = f"{gate.agent_url}/_opgate/v1/operations/{op.operation_id}"
        headers = {"Authorization": f"Bearer {AGENT_TOKEN}"}
        try:
            async with self.http.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=30)
            ) as response:
                self.other_answers.append(("recovery read", response.status))
                if response.status != 200:
                    return None
                view: dict[str, Any] = await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.violations.append(f"{op.operation_id}: recovery read got no answer: {exc!r}")
            return None
        self.advised[op.operation_id].add(view["next_action"])
        self.note(
            f"agent read {op.operation_id} @{self.instance(gate)} -> {view['next_action']}"
            f" ({view['operation']['status']}, attempts {view['operation']['attempts']})"
        )
        return view

    async def revoke(self, op: ModelOperation, gate: Opgate) -> None:
        try:
            async with self.http.post(
                f"{gate.ops_url}/v1/operations/{op.operation_id}/revoke",
                json={"reason": "the model withdraws it"},
                headers=admin_headers(),
                timeout=aiohttp.ClientTimeout(total=30),
            ) as response:
                self.other_answers.append(("revoke", response.status))
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.violations.append(f"{op.operation_id}: revoke got no answer: {exc!r}")
            return
        if response.status == 409 and answer.get("code") == "operation_settled":
            # nothing left to stop: the final check holds that it did end settled
            self.refused_revokes.add(op.operation_id)
            self.note(f"admin revoke {op.operation_id}: refused, settled")
            return
        if response.status != 200:
            self.violations.append(f"{op.operation_id}: revoke answered {response.status}")
        self.revoked.add(op.operation_id)
        self.note(f"admin revoke {op.operation_id}")


def _nth(modes: list[FaultMode], n: int) -> FaultMode:
    return modes[n] if n < len(modes) else FaultMode.OK


def _draw(rng: random.Random, weights: dict[FaultMode, int], count: int) -> list[FaultMode]:
    return rng.choices(list(weights), weights=list(weights.values()), k=count)


async def _think(rng: random.Random, low: float, high: float) -> None:
    """An actor's think-time: part of the model (when things happen), not a synchronisation."""
    await asyncio.sleep(rng.uniform(low, high))


async def agent(world: World, op: ModelOperation, rng: random.Random, steps: int) -> None:
    """An agent with one operation: blind sends, bursts, and the recovery protocol."""
    await asyncio.sleep(op.arrival)  # agents arrive spread out (drawn with the plan)
    for _ in range(steps):
        world.steps += 1
        kind = rng.choices(["send", "burst", "follow"], weights=[3, 1, 4])[0]
        if kind == "send":
            await world.send(op, rng.choice(world.gates), "send")
        elif kind == "burst":
            await asyncio.gather(
                *(world.send(op, gate, "burst") for gate in rng.sample(world.gates, 2))
            )
        else:
            gate = rng.choice(world.gates)
            view = await world.read(op, gate)
            if view is not None:
                action = view["next_action"]
                if action in ("send", "retry"):
                    if view.get("request") != op.approved_request:
                        world.violations.append(
                            f"{op.operation_id}: the recovery read's request is not the"
                            f" approved one: {view.get('request')}"
                        )
                    await world.send(op, rng.choice(world.gates), f"follow:{action}")
                elif action in ("wait", "reconcile"):
                    told = float(view.get("retry_after_seconds") or 0.1)
                    await _think(rng, 0.0, min(told, 0.5))
                elif rng.random() < 0.5:  # proceed, new_approval_required, escalated: done
                    return
        await _think(rng, 0.0, 0.25)


async def releaser(world: World, rng: random.Random, stop: asyncio.Event) -> None:
    """Lets every stalled request go at random moments."""
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), rng.uniform(0.1, 0.8))  # a think-time
        except TimeoutError:
            world.provider.release()


async def admin(world: World, rng: random.Random) -> None:
    """Revokes some approvals at random moments, through either replica's operations API."""
    chosen = [op for op in world.ops if rng.random() < 0.15]
    moments = sorted((rng.uniform(0.0, ARRIVALS_SECONDS + 1), op.index) for op in chosen)
    started = time.monotonic()
    for moment, index in moments:
        await asyncio.sleep(max(0.0, moment - (time.monotonic() - started)))  # a think-time
        await world.revoke(world.ops[index], rng.choice(world.gates))


@dataclass
class Final:
    """What the run left: rows, events, audit records, the provider's ground truth."""

    rows: dict[str, dict[str, Any]]
    events: dict[str, list[dict[str, Any]]]
    records: dict[str, list[dict[str, Any]]]  # by operation id


async def read_final(database_url: str) -> Final:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT * FROM operations")
        events = await conn.fetch(
            "SELECT operation_id, event, actor, detail::text AS detail FROM operation_events"
            " ORDER BY event_id"
        )
        # A request record in its operation's stream (written by the outcome's statement,
        # migration 0022) is the instance's that wrote the transition before it: it is keyed
        # by that instance's request stream, as one the instance's writer stored is.
        records = await conn.fetch(
            "SELECT CASE WHEN a.stream = a.operation_id"
            " THEN 'requests/' || (t.record ->> 'instance_id') ELSE a.stream END AS stream,"
            " a.operation_id, a.record::text AS record FROM audit_log a"
            " LEFT JOIN audit_log t ON t.stream = a.stream AND t.seq = a.seq - 1"
            " WHERE a.kind = 'request' ORDER BY a.stream, a.seq"
        )
    finally:
        await conn.close()
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_op[e["operation_id"]].append(
            {"event": e["event"], "actor": e["actor"], "detail": json.loads(e["detail"])}
        )
    records_by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        records_by_op[r["operation_id"] or ""].append(
            {"stream": r["stream"], **json.loads(r["record"])}
        )
    return Final({r["operation_id"]: dict(r) for r in rows}, by_op, records_by_op)


async def wait_until_quiet(database_url: str, provider: FaultProvider) -> list[str]:
    """Poll (bounded) until every operation is settled, escalated, never sent or left to its
    agent's retry, with nothing in flight; returns what is still unsettled at the bound."""
    deadline = time.monotonic() + SETTLE_SECONDS
    conn = await asyncpg.connect(database_url)
    try:
        while True:
            provider.release()  # stalls that arrived before the provider healed
            busy = await conn.fetch(
                "SELECT operation_id, status, last_outcome, escalated_at IS NOT NULL AS escalated"
                " FROM operations WHERE coalesce(lease_until > now(), false)"
                " OR coalesce(reconcile_lease_until > now(), false)"
                " OR (status = 'dispatched' AND escalated_at IS NULL"
                "     AND last_outcome IS DISTINCT FROM 'not_sent'"
                # left to the agent's retry (a retained key, no lookup to ask): not for the loop
                "     AND NOT coalesce(next_reconcile_at > now() + interval '60 s', false))"
            )
            if not busy:
                return []
            if time.monotonic() > deadline:
                return [str(dict(r)) for r in busy]
            await asyncio.sleep(0.05)  # polling interval of a bounded wait
    finally:
        await conn.close()


def check(world: World, final: Final) -> list[str]:
    """Every invariant of the promise; each broken one is named with its operation."""
    provider = world.provider
    violations = list(world.violations)
    by_id = {op.operation_id: op for op in world.ops}
    effects: dict[str, list[Any]] = defaultdict(list)
    for effect in provider.effects:
        effects[effect.operation_id or ""].append(effect)
        op = by_id.get(effect.operation_id or "")
        if op is None or effect.idempotency_key != op.key:
            violations.append(f"effect {effect.id} of no operation, or under another key")
    for key, count in Counter(e.idempotency_key for e in provider.effects).items():
        if count > 1:
            violations.append(f"key {key}: {count} effects")
    posts: dict[str, list[Any]] = defaultdict(list)
    for request in provider.requests:
        if request.method == "POST":
            posts[request.headers.get("X-Operation-Id", "")].append(request)
    violations.extend(
        f"{len(posts[oid])} POSTs at the provider for no operation ({oid!r})"
        for oid in posts.keys() - by_id.keys()
    )

    for op in world.ops:
        oid, row = op.operation_id, final.rows[op.operation_id]
        mine, sent_posts = effects.get(oid, []), posts.get(oid, [])
        if len(mine) > 1:
            violations.append(f"{oid}: {len(mine)} effects at the provider: at most once broken")
        if row["status"] == "confirmed" and not (
            len(mine) == 1 and row["provider_object_id"] == mine[0].id
        ):
            violations.append(f"{oid}: confirmed ({row['provider_object_id']}) without its effect")
        if row["status"] == "failed" and mine:
            violations.append(f"{oid}: failed ({row['settled_reason']}) with an effect")
        if row["status"] == "created" and sent_posts:
            violations.append(f"{oid}: created, yet the provider saw {len(sent_posts)} requests")
        claims = [e for e in final.events[oid] if e["event"] == "claimed"]
        if len(claims) != row["attempts"] or len(sent_posts) > row["attempts"]:
            violations.append(
                f"{oid}: {len(sent_posts)} requests at the provider, {len(claims)} claims,"
                f" {row['attempts']} attempts"
            )
        for request in sent_posts:
            if (
                request.fields != {**op.form, "metadata[operation_id]": oid}
                or request.headers.get("Idempotency-Key") != op.key
                or request.headers.get("Authorization") != f"Bearer {PROVIDER_SECRET}"
            ):
                violations.append(f"{oid}: the provider got something else: {request.fields}")
        if oid in world.refused_revokes and row["status"] not in ("confirmed", "failed"):
            violations.append(f"{oid}: a revoke was refused as settled; it ended {row['status']}")
        advised = world.advised.get(oid, set())
        if "proceed" in advised and row["status"] != "confirmed":
            violations.append(f"{oid}: an agent was told to proceed; it ended {row['status']}")
        if "new_approval_required" in advised and row["status"] not in ("failed", "created"):
            violations.append(f"{oid}: told a new approval was required; it ended {row['status']}")
        ended = False
        for event in final.events[oid]:
            if event["event"] == "claimed" and ended:
                violations.append(f"{oid}: claimed after it was revoked or settled")
            if event["event"] in ("revoked", "confirmed", "failed", "reconciled", "resolved"):
                ended = True

    # What the agents were told, and the audit records of what they sent.
    for sent in world.sent:
        if sent.status is None:
            continue
        where = f"{sent.operation_id}: {sent.via} @{sent.instance}"
        if sent.status not in AGENT_STATUSES:
            violations.append(f"{where} answered {sent.status}: {sent.body[:200]!r}")
        problem = sent.content_type == "application/problem+json"
        if sent.status >= 400 and sent.status != 402 and not problem:
            violations.append(f"{where} answered {sent.status} as {sent.content_type}")
        if 200 <= sent.status < 300:
            mine = effects.get(sent.operation_id, [])
            try:
                got = json.loads(sent.body).get("id")
            except (ValueError, AttributeError):
                got = f"not a provider object: {sent.body[:200]!r}"
            if len(mine) != 1 or got != mine[0].id:
                violations.append(f"{where} was told {got}, the effects are {mine}")
    violations.extend(
        f"{what} answered {status}" for what, status in world.other_answers if status == 500
    )
    expected: dict[tuple[str, str], list[int | None]] = defaultdict(list)
    for sent in world.sent:
        expected[(request_stream(sent.instance), sent.operation_id)].append(sent.status)
    recorded: dict[tuple[str, str], list[int | None]] = defaultdict(list)
    for oid, records in final.records.items():
        for record in records:
            if record.get("record_type") or record.get("rule") == "recovery":
                continue  # writer bookkeeping, and recovery reads (checked in test_audit.py)
            recorded[(record["stream"], oid)].append(record["response_status"])
    for place in expected.keys() | recorded.keys():
        want, have = expected.get(place, []), recorded.get(place, [])
        known = [s for s in want if s is not None]
        if len(want) != len(have) or (
            len(known) == len(want) and sorted(known) != sorted(s or 0 for s in have)
        ):
            violations.append(f"{place}: agent requests answered {want}, audit records {have}")
    for op in world.ops:
        attempts = sorted(
            r["attempt"] for r in final.records.get(op.operation_id, []) if r["attempt"]
        )
        if attempts != list(range(1, final.rows[op.operation_id]["attempts"] + 1)):
            violations.append(f"{op.operation_id}: claiming requests' records name {attempts}")
    return violations


def figures(world: World, final: Final, seconds: float) -> dict[str, Any]:
    rows = final.rows.values()
    return {
        "policy": world.policy.name,
        "seed": world.seed,
        "steps": world.steps,
        "step_budget": STEPS,
        "operations": len(world.ops),
        "agent_requests": len(world.sent),
        "provider_posts": sum(1 for r in world.provider.requests if r.method == "POST"),
        "provider_lookups": sum(1 for r in world.provider.requests if r.method == "GET"),
        "effects": len(world.provider.effects),
        "revoked": len(world.revoked),
        "revokes_refused_settled": len(world.refused_revokes),
        "attempts": sum(r["attempts"] for r in rows),
        "statuses": dict(Counter("escalated" if r["escalated_at"] else r["status"] for r in rows)),
        "resent": sum(max(0, r["attempts"] - 1) for r in rows),
        "settled_by": dict(Counter(r["settled_reason"] for r in rows if r["settled_reason"])),
        "agent_answers": dict(Counter(str(s.status) for s in world.sent)),
        "retention_seconds": world.retention,
        "background_intervals": [round(x, 2) for x in world.loops],
        "seconds": round(seconds, 1),
    }


def report(world: World, final: Final, violations: list[str]) -> str:
    """Everything needed to understand a failure: the seed, what broke, each operation's
    events and the provider's view of it, and the tail of the run's trace."""
    lines = [
        f"OPGATE_MODEL_SEED={world.seed} policy={world.policy.name} steps={STEPS}",
        *violations[:40],
    ]
    named = {op.operation_id for op in world.ops if any(op.operation_id in v for v in violations)}
    for oid in sorted(named)[:5]:
        lines.append(f"--- {oid}")
        row = final.rows.get(oid, {})
        lines.append(
            f"row: {row.get('status')} attempts={row.get('attempts')}"
            f" last_outcome={row.get('last_outcome')} settled={row.get('settled_reason')}"
        )
        lines.extend(
            f"event {e['event']} by {e['actor']}: {e['detail']}" for e in final.events.get(oid, [])
        )
        lines.extend(line for line in world.trace if oid in line)
    lines.append("--- trace tail")
    lines.extend(world.trace[-60:])
    return "\n".join(lines)


async def run_model(
    policy: Policy,
    seed: int,
    start_opgate: StartOpgate,
    policy_dir: Path,
    provider: FaultProvider,
    database_url: str,
) -> tuple[World, Final, list[str], float]:
    rng = random.Random(f"{seed}:{policy.name}")
    # No approval may outlive the key's retention (approval_not_sendable), so a lapse needs a
    # policy changed under a standing approval: tests/gate/test_resend.py covers it.
    retention = 86400.0
    (policy_dir / "fault.yaml").write_text(
        fault_policy(
            deduplicates=policy.policy_says_deduplicates,
            total_timeout=policy.total_timeout,
            grace_seconds=GRACE if policy.lookups else None,
            max_attempts=3,
            retry_seconds=0.1,
            escalated_retry_seconds=0.2,
            retention_seconds=retention,
        )
    )
    provider.deduplicate = policy.provider_deduplicates
    provider.slow_seconds = SLOW
    replica = {
        "upstream_overrides": {"fault": provider.url},
        "lease_margin_seconds": LEASE_MARGIN,
        "policy_reload_interval_seconds": 0,
    }
    # Background loops slow enough, now and then, that agents' re-sends race them.
    loops = (rng.uniform(0.1, 1.0), rng.uniform(0.3, 2.0))
    started = time.monotonic()
    connector = aiohttp.TCPConnector(force_close=True)  # a request never rides a stale socket
    async with (
        aiohttp.ClientSession(trust_env=False, connector=connector) as http,
        start_opgate(instance_id="model-a", background_interval_seconds=loops[0], **replica) as a,
        start_opgate(instance_id="model-b", background_interval_seconds=loops[1], **replica) as b,
    ):
        world = World(seed, policy, provider, [a, b], http, retention=retention, loops=loops)
        provider.chooser = world.choose
        count = max(2, STEPS // STEPS_PER_OPERATION)
        for i in range(count):
            arrival = rng.uniform(0.0, ARRIVALS_SECONDS)
            # Some approvals expire while their agent is at work.
            ttl = int(arrival) + rng.randint(2, 4) if rng.random() < 0.15 else 600
            approved = await rng.choice(world.gates).approve(
                params={"charge": f"ch_{i}"}, amount=100 + i, ttl_seconds=ttl
            )
            op = ModelOperation(
                i,
                approved["operation_id"],
                approved["idempotency_key"],
                f"ch_{i}",
                100 + i,
                _draw(rng, POST_FAULTS, 6),
                _draw(rng, GET_FAULTS, 6) if policy.lookup_faults else [],
                arrival,
            )
            world.ops.append(op)
            world.by_id[op.operation_id], world.by_charge[op.charge] = op, op
        budget = Counter(rng.randrange(count) for _ in range(STEPS))
        stop = asyncio.Event()
        actors: list[Awaitable[None]] = [
            agent(world, op, random.Random(f"{seed}:{policy.name}:{op.index}"), budget[op.index])
            for op in world.ops
        ]
        actors.append(admin(world, random.Random(f"{seed}:{policy.name}:admin")))
        freeing = asyncio.create_task(
            releaser(world, random.Random(f"{seed}:{policy.name}:release"), stop)
        )
        try:
            await asyncio.gather(*actors)
        finally:
            stop.set()
            await freeing
        world.healed = True
        world.note("provider healed")
        unsettled = await wait_until_quiet(database_url, provider)
        world.violations.extend(f"did not settle in {SETTLE_SECONDS:g} s: {u}" for u in unsettled)
        for gate in world.gates:  # request records are batched: wait for each writer
            observability = gate.running.gateway.observability
            assert observability is not None
            assert observability.writer is not None
            await observability.writer.flush()
        final = await read_final(database_url)
    return world, final, check(world, final), time.monotonic() - started


@pytest.mark.parametrize("policy", POLICIES, ids=[p.name for p in POLICIES])
async def test_at_most_once_holds_under_the_model(
    policy: Policy,
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under concurrent agents, two replicas, background reconcilers, revocations, expiries and
    every provider fault, no operation has two effects, every settlement agrees with the
    provider, every agent request has its audit record, and opgate never answers 500."""
    caplog.set_level(logging.ERROR)
    try:
        with capture_logs() as logs:
            world, final, violations, seconds = await run_model(
                policy, SEED, start_opgate, policy_dir, fault_provider, database_url
            )
    except BaseException as exc:  # whatever broke, say how to run it again
        exc.add_note(f"OPGATE_MODEL_SEED={SEED} policy={policy.name} steps={STEPS}")
        raise
    violations.extend(
        f"logged an error: {entry}" for entry in logs if entry.get("log_level") == "error"
    )
    violations.extend(f"logged an error: {r.name}: {r.getMessage()}" for r in caplog.records)
    warnings = Counter(str(e["event"]) for e in logs if e.get("log_level") == "warning")
    shown = {**figures(world, final, seconds), "warnings": warnings}
    print(f"\nmodel figures: {json.dumps(shown)}")
    assert not violations, report(world, final, violations)
