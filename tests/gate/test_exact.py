"""A first send claimed as sent (proxy/gate/exact.py; queries.sql ``claim_operation``, $9).

Against a real PostgreSQL: the claim's WHERE takes only rows that the checks accept, a row it
leaves alone comes back untouched for the checks, and what it cannot state exactly goes the
ordinary way."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio

from proxy.gate.bodies import ABSENT  # a value the request or the approval leaves out
from proxy.gate.checks import Agent, RequestFacts, decide, first_payload_refusal
from proxy.gate.decision import ClaimKind, Forward
from proxy.gate.exact import as_sent
from proxy.gate.preconditions import recheck_due_on_first_send
from proxy.policy.model import Provider
from proxy.store.operation import Operation, Status
from proxy.store.proposal import PROPOSAL_ID_PREFIX
from proxy.store.store import NewOperation, Store
from tests.support.facts import (
    AGENT,
    JPAY,
    PAY,
    POLICY,
    load_provider,
    make_facts,
    make_operation,
)


@pytest_asyncio.fixture(loop_scope="session")
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, min_size=1, max_size=4)
    yield opened
    await opened.close()


def approval(operation_id: str, provider: Provider, **fields: Any) -> NewOperation:
    """A created refund (PAY) or transfer (JPAY) of 500 usd, approved for AGENT."""
    rule = provider.rules[0]
    values: dict[str, Any] = {
        "operation_id": operation_id,
        "tenant": AGENT.tenant,
        "agent_id": AGENT.agent_id,
        "provider": provider.provider,
        "action": rule.name,
        "method": rule.method,
        "path": rule.path.text,
        "path_params": {},
        "amount": 500,
        "currency": "usd",
        "params": {"charge": "ch_1"} if provider is PAY else {"/destination": "acct_1"},
        "idempotency_key": f"key-{operation_id}",
        "approval_ref": "ticket-1",
        "approved_by": "alice",
        "expires_at": datetime.now(UTC) + timedelta(minutes=5),
    }
    return NewOperation(**(values | fields))


def transfer(body: dict[str, Any], operation_id: str, agent: Agent = AGENT) -> RequestFacts:
    facts = make_facts(provider=JPAY, rule="transfer.create", path="/v1/transfers", json=body)
    return replace(facts, named_operation_id=operation_id, agent=agent)


def refund(form: dict[str, str], operation_id: str, agent: Agent = AGENT) -> RequestFacts:
    return replace(make_facts(form), named_operation_id=operation_id, agent=agent)


async def claim(store: Store, facts: RequestFacts) -> tuple[Operation | None, bool]:
    request = as_sent(facts)
    assert request is not None
    assert facts.named_operation_id is not None
    return await store.claim_as_sent(
        facts.named_operation_id, request, owner="me", lease_seconds=30
    )


# --- what as_sent states, and what it leaves to the ordinary way (pure) --------------------
def test_states_the_request_as_the_claim_compares_it() -> None:
    """The request's own terms, for the row that make_operation() approves for it."""
    stated = as_sent(refund({"amount": "500", "currency": "usd", "charge": "ch_1"}, "op_1"))
    assert stated is not None
    request, approved = json.loads(stated), make_operation()
    columns = ("tenant", "agent_id", "provider", "action", "method", "path", "amount", "params")
    assert {c: request[c] for c in columns} == {c: getattr(approved, c) for c in columns}
    assert (request["currency"], request["idempotency_key"]) == (["usd", "USD"], None)
    assert set(request) == {*columns, "currency", "idempotency_key"}


PRECONDITIONS = POLICY.format(dedup="false").replace(
    "    path: /v1/refunds\n",
    "    path: /v1/refunds\n"
    "    preconditions:\n"
    "      lookups:\n"
    "        - path: /v1/refunds\n"
    "          require: ['/object == \"list\"']\n",
    1,
)
BUDGETED = POLICY.format(dedup="false").replace(
    "rules:\n", "budgets:\n  - {scope: tenant, currency: usd, limit: 10, window: 24h}\nrules:\n", 1
)


def rechecked_after(seconds: float) -> Provider:
    """PAY, its refunds' preconditions rechecked once an approval is ``seconds`` old."""
    lookups = "      lookups:\n"
    recheck = f"      recheck_after_seconds: {seconds}\n"
    return load_provider(PRECONDITIONS.replace(lookups, recheck + lookups, 1))


PAY_RECHECKED = rechecked_after(300)


@pytest.mark.parametrize(
    ("why", "facts"),
    [
        ("no operation named", replace(make_facts(), named_operation_id=None)),
        (
            "the injected field, with the operation named by its key alone",
            make_facts(
                {"amount": "500", "metadata[operation_id]": "op_1"},
                named_operation_id=None,
                idempotency_key="key-1",
            ),
        ),
        ("an unexpected field", make_facts({"amount": "500", "currency": "usd", "x": "1"})),
        ("the injected field", make_facts({"amount": "500", "metadata[operation_id]": "op_2"})),
        ("a field read as the injected one", make_facts({"metadata[operation_id][x]": "1"})),
        (
            "a field read as the injected one, the operation named by its key alone",
            make_facts(
                {"amount": "500", "metadata[operation_id][x]": "1"},
                named_operation_id=None,
                idempotency_key="key-1",
            ),
        ),
        ("a currency that is not ASCII letters", make_facts({"amount": "500", "currency": "u$d"})),
        ("an amount that does not read", make_facts({"amount": "05", "currency": "usd"})),
        ("a NUL in a parameter", make_facts({"amount": "500", "charge": "ch\x00"})),
        ("a float with an exponent", transfer({"amount": 500, "/count": 1e16}, "op_1")),
        ("an integer beyond bigint", transfer({"amount": 2**63, "currency": "usd"}, "op_1")),
    ],
)
def test_leaves_to_the_ordinary_way_what_it_cannot_state(why: str, facts: RequestFacts) -> None:
    assert as_sent(facts) is None, why


def test_a_float_with_an_exponent_inside_a_parameter_is_left_alone() -> None:
    body = {"amount": 500, "currency": "usd", "destination": {"share": 1e-05}}
    assert as_sent(transfer(body, "op_1")) is None
    body["destination"] = {"share": 0.00001 * 10}
    assert as_sent(transfer(body, "op_1")) is not None  # 0.0001: written without one


@pytest.mark.parametrize(
    "provider",
    [
        pytest.param(load_provider(PRECONDITIONS), id="preconditions always rechecked"),
        pytest.param(rechecked_after(0.0005), id="rechecked within the margin"),
        pytest.param(load_provider(BUDGETED), id="a spend budget"),
    ],
)
def test_rules_whose_claim_waits_on_a_lookup_or_a_lock_are_left_alone(provider: Provider) -> None:
    assert as_sent(make_facts(provider=provider)) is None
    assert as_sent(make_facts()) is not None  # the same request under the plain policy


def test_a_rule_with_preconditions_states_that_no_recheck_is_due() -> None:
    stated = as_sent(make_facts(provider=PAY_RECHECKED))
    assert stated is not None
    assert json.loads(stated)["no_recheck"] == {
        "younger_than": 299.999,  # the rule's 300 s less the margin
        "proposal_prefix": PROPOSAL_ID_PREFIX,
    }


# --- the claim's WHERE, against a real PostgreSQL ------------------------------------------
async def test_the_approved_request_is_claimed_with_its_event(store: Store) -> None:
    await store.create(approval("op_exact", PAY), "test")
    facts = refund({"amount": "500", "currency": "USD", "charge": "ch_1"}, "op_exact")
    op, claimed = await claim(store, facts)
    assert claimed
    assert op is not None
    assert (op.status, op.attempts, op.lease_owner) == (Status.DISPATCHED, 1, "me")
    assert [e["event"] for e in await store.events("op_exact")] == ["created", "claimed"]


@pytest.mark.parametrize(
    ("why", "approved", "body", "agent"),
    [
        ("another amount", {}, {"amount": 499, "currency": "usd"}, AGENT),
        ("another agent", {}, {"amount": 500, "currency": "usd"}, Agent("agent-2", "acme")),
        ("another tenant", {"agent_id": None}, {"amount": 500, "currency": "usd"}, Agent("a", "b")),
        ("1.0 for an approved 1", {"params": {"/count": 1}}, {"amount": 500, "/count": 1.0}, AGENT),
        (
            "true for an approved 1",
            {"params": {"/count": 1}},
            {"amount": 500, "/count": True},
            AGENT,
        ),
        ("a list in another order", {"params": {"/count": [1, 2]}}, {"/count": [2, 1]}, AGENT),
        ("a revoked approval", {}, {"amount": 500, "currency": "usd"}, AGENT),
        (
            "an expired approval",
            {"expires_at": datetime.now(UTC) - timedelta(seconds=1)},
            {},
            AGENT,
        ),
    ],
)
async def test_what_the_checks_refuse_is_not_claimed_and_comes_back_untouched(
    store: Store, why: str, approved: dict[str, Any], body: dict[str, Any], agent: Agent
) -> None:
    approved = {"params": {}} | approved
    await store.create(approval("op_1", JPAY, **approved), "test")
    if why == "a revoked approval":
        await store.revoke("op_1", "withdrawn", "test")
    sent = {"amount": 500, "currency": "usd"} | body
    if "/count" in sent:
        sent["count"] = sent.pop("/count")
    facts = transfer(sent, "op_1", agent)
    op, claimed = await claim(store, facts)
    assert not claimed, why
    assert op is not None
    assert (op.status, op.attempts) == (Status.CREATED, 0)
    assert decide(facts, op, operation_lookup_failed=True) != Forward(ClaimKind.FIRST), why
    assert [e["event"] for e in await store.events("op_1")][-1] != "claimed"


@pytest.mark.parametrize(
    ("why", "approved", "age", "expected"),
    [
        ("a fresh approval", {}, 0.0, True),
        ("an approval as old as the recheck age", {}, 300.0, False),
        ("an approval younger by less than the margin", {}, 299.9995, False),
        ("an approval superseding another", {"supersedes": "op_old"}, 0.0, False),
        (
            "an approval from a proposal",
            {"approval_ref": "prop_0123456789abcdef01234567"},
            0.0,
            False,
        ),
    ],
)
async def test_a_rule_with_preconditions_is_claimed_as_sent_only_when_no_recheck_is_due(
    store: Store, why: str, approved: dict[str, Any], age: float, expected: bool
) -> None:
    """The WHERE's "no recheck due" agrees with the pipeline's (proxy/gate/preconditions.py) on
    the row it returns: what it claims needs no lookup, and what it leaves does."""
    charge = {"params": {"charge": "ch_1"}}
    if "supersedes" in approved:
        await store.create(approval("op_old", PAY_RECHECKED, **charge), "test")
    await store.create(approval("op_1", PAY_RECHECKED, **charge, **approved), "test")
    await store.run(
        lambda conn: conn.execute(
            "UPDATE operations SET created_at = now() - make_interval(secs => $1)"
            " WHERE operation_id = 'op_1'",
            age,
        )
    )
    facts = make_facts(
        {"amount": "500", "currency": "usd", "charge": "ch_1"}, provider=PAY_RECHECKED
    )
    op, claimed = await claim(store, facts)
    assert claimed is expected, why
    assert op is not None
    assert (recheck_due_on_first_send(facts.rule, op) is None) is expected, why
    if not claimed:
        assert (op.status, op.attempts) == (Status.CREATED, 0)


async def test_jsonb_equality_alone_would_have_claimed_1_for_1_0(store: Store) -> None:
    """Why the parameters compare as texts: jsonb's ``=`` equates them, the checks do not."""
    assert await store.run(lambda conn: conn.fetchval("SELECT '1'::jsonb = '1.0'::jsonb"))


@pytest.mark.parametrize(
    ("why", "approved"),
    [
        ("a currency spelt in mixed case", {"currency": "Usd"}),
        ("a parameter the rule does not check", {"params": {"charge": "ch_1", "note": "x"}}),
    ],
)
async def test_what_the_checks_accept_but_the_claim_cannot_state_goes_the_ordinary_way(
    store: Store, why: str, approved: dict[str, Any]
) -> None:
    await store.create(approval("op_1", PAY, **approved), "test")
    facts = refund({"amount": "500", "currency": "usd", "charge": "ch_1"}, "op_1")
    op, claimed = await claim(store, facts)
    assert not claimed, why
    assert op is not None
    assert decide(facts, op, operation_lookup_failed=True) == Forward(ClaimKind.FIRST), why


async def test_a_request_naming_its_operation_by_key_alone_claims_that_row(store: Store) -> None:
    await store.create(approval("op_by_key", PAY), "test")
    await store.create(approval("op_other", PAY), "test")
    facts = refund({"amount": "500", "currency": "usd", "charge": "ch_1"}, "op_by_key")
    by_key = replace(facts, named_operation_id=None, idempotency_key="key-op_by_key")
    op, claimed = await store.claim_as_sent(
        None, as_sent(by_key) or "", owner="me", lease_seconds=30
    )
    assert claimed
    assert op is not None
    assert (op.operation_id, op.status) == ("op_by_key", Status.DISPATCHED)
    assert (await store.load("op_other") or op).status is Status.CREATED
    unknown = replace(by_key, idempotency_key="key-nobody")
    assert await store.claim_as_sent(
        None, as_sent(unknown) or "", owner="me", lease_seconds=30
    ) == (None, False)


async def test_an_agent_of_the_tenant_claims_a_row_approved_for_any(store: Store) -> None:
    await store.create(approval("op_any", PAY, agent_id=None), "test")
    facts = refund({"amount": "500", "currency": "usd", "charge": "ch_1"}, "op_any")
    _, claimed = await claim(store, replace(facts, agent=Agent("agent-9", "acme")))
    assert claimed


# Values a request or an approval may hold for a parameter: the pairs the checks tell apart
# (1 and 1.0, true and 1, "1" and 1, lists in order, objects by key).
VALUES: list[Any] = [
    ABSENT, None, 0, 1, 1.0, 0.5, True, False, "1", "acct_1", "ACCT_1", "",
    [1, 2], [2, 1], [1.0, 2], {"a": 1}, {"a": 1.0}, {"a": 1, "b": 2}, {"b": 2, "a": 1},
]  # fmt: skip
CURRENCIES: list[Any] = [ABSENT, "usd", "USD", "Usd", "eur", "jpy"]
AMOUNTS: list[Any] = [ABSENT, 500, 499, "500", 500.0, True]


def _present(pairs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in pairs.items() if v is not ABSENT}


async def test_every_claim_is_one_the_checks_accept(store: Store) -> None:
    """A sweep of requests and approvals that differ in how the checks tell values apart: each
    claim the WHERE makes is accepted by the checks, each refusal of the checks claims nothing,
    and the approved request itself is claimed."""
    chosen = random.Random(20261201)
    seen = {"claimed": 0, "refused": 0, "accepted by the checks, not claimed": 0}
    for n in range(300):
        approved_count = chosen.choice(VALUES)
        approved_currency = chosen.choice(["usd", "USD", "Usd", "eur", None])
        approved_amount = chosen.choice([500, None])
        # each of the request's values is the approved one more often than not
        sent_count = approved_count if chosen.random() < 0.6 else chosen.choice(VALUES)
        sent_currency = chosen.choice(CURRENCIES)
        if chosen.random() < 0.6:
            sent_currency = ABSENT if approved_currency is None else approved_currency.lower()
        sent_amount = chosen.choice(AMOUNTS)
        if chosen.random() < 0.6:
            sent_amount = ABSENT if approved_amount is None else approved_amount
        operation_id = f"op_{n}"
        await store.create(
            approval(
                operation_id,
                JPAY,
                amount=approved_amount,
                currency=approved_currency,
                params=_present({"/destination": "acct_1", "/count": approved_count}),
            ),
            "test",
        )
        body = _present(
            {
                "amount": sent_amount,
                "currency": sent_currency,
                "destination": "acct_1",
                "count": sent_count,
            }
        )
        facts = transfer(body, operation_id)
        if as_sent(facts) is None:
            continue
        op, claimed = await claim(store, facts)
        assert op is not None
        if claimed:
            seen["claimed"] += 1
            assert first_payload_refusal(facts, op) is None, (approved_count, body)
            continue
        assert (op.status, op.attempts) == (Status.CREATED, 0)
        if decide(facts, op, operation_lookup_failed=True) == Forward(ClaimKind.FIRST):
            seen["accepted by the checks, not claimed"] += 1
        else:
            seen["refused"] += 1
    assert all(count > 10 for count in seen.values()), seen
