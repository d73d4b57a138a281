"""Signed mandates end to end: real opgate, real PostgreSQL, the fault provider, mandates minted
by the tests with their own keys. A person's mandate becomes exactly one operation; its
request goes through once; every refusal is a code with a signed error receipt."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import pytest_asyncio
from joserfc import jws
from joserfc.jwk import ECKey, KeySet

from proxy.operations import mandates_api
from tests.support.fault_provider import FaultProvider
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    issued_nonce,
    mandate_policy,
    mandate_settings,
    present,
    send_exactly,
)
from tests.support.mandates import (
    Signer,
    checkout_jwt,
    closed_checkout,
    closed_checkout_content,
    closed_mandate,
    closed_payment,
    digest,
    high_s,
    identity,
    open_checkout,
    open_mandate,
    present_under,
    twin,
)
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    admin_headers,
    process_env,
)
from tests.support.opgate_process import opgate_process


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as running:
        yield running


def decoded_transaction_id(mandate: str) -> str:
    """The transaction_id the person's closed mandate (tests/support/mandates.py) carries."""
    payload = mandate.split("~", 1)[0].split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    transaction_id: str = claims["transaction_id"]
    return transaction_id


async def receipt_claims(gate: Opgate, receipt: str) -> dict[str, Any]:
    """The receipt's claims, verified with the key opgate publishes (and no other)."""
    async with gate.http.get(f"{gate.agent_url}/.well-known/jwks.json") as response:
        assert response.status == 200
        keys = KeySet.import_key_set(await response.json())
    verified = jws.deserialize_compact(receipt, keys, algorithms=["ES256"])
    claims: dict[str, Any] = json.loads(verified.payload)
    return claims


async def test_a_closed_mandate_becomes_one_operation_sent_once(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Presented: 201, an operation holding the mandate's amount and currency, approved by the
    person, a signed success receipt; its request goes through once; presented again, the same
    operation (200) and no second effect; the final receipt names the provider's object."""
    mandate = closed_mandate(PERSON, amount=2500, currency="USD")
    status, answer = await present(gate, gate.http, mandate)
    assert status == 201, answer
    op = answer["operation"]["operation"]
    assert (op["amount"], op["currency"]) == (2500, "usd")
    # the payee, instrument and reference are the mandate's, where the policy says they go
    assert op["params"] == {
        "destination": "acct_merchant",
        "source": "pm_card",
        "reference": decoded_transaction_id(mandate),
    }
    assert op["approval"]["approved_by"] == "surface:alice"
    assert op["approval"]["ref"] == f"ap2:{answer['mandate_digest']}"
    claims = await receipt_claims(gate, answer["receipt"])
    assert (claims["result"], claims["operation_id"], claims["iss"]) == (
        "success",
        op["operation_id"],
        AUDIENCE,
    )

    assert await send_exactly(gate, gate.http, answer["operation"]["request"]) == 200
    status, again = await present(gate, gate.http, mandate)
    assert status == 200
    assert again["operation"]["operation"]["operation_id"] == op["operation_id"]
    assert again["operation"]["next_action"] == "proceed"
    assert len(fault_provider.effects) == 1

    status, _, raw = await gate.send(
        f"/_opgate/v1/mandates/{op['operation_id']}/receipt", method="GET", content_type=None
    )
    final = json.loads(raw)
    assert (status, final["settled"]) == (200, True)
    claims = await receipt_claims(gate, final["receipt"])
    # AP2's Payment Receipt claims (payment_receipt.json), and opgate's operation state beside
    assert (claims["status"], claims["operation_status"]) == ("Success", "confirmed")
    assert claims["payment_id"] == claims["psp_confirmation_id"] == fault_provider.effects[0].id


async def present_receipt(
    gate: Opgate, receipt: str, token: str = AGENT_TOKEN
) -> tuple[int, dict[str, Any]]:
    async with gate.http.post(
        f"{gate.agent_url}/_opgate/v1/mandates/receipts",
        json={"receipt": receipt},
        headers={"Authorization": f"Bearer {token}"},
    ) as response:
        return response.status, json.loads(await response.read())


async def test_presentations_are_admitted_like_every_agent_request(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """With one request per second per agent, ten mandates presented at once make one
    operation: the others are 429 rate_limited with Retry-After, nothing created for them
    (a presentation writes an operation and its audit record: an agent may not flood them)."""
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        requests_per_second_per_agent=1,
        **mandate_settings(tmp_path),
    ) as limited:
        mandates = [closed_mandate(PERSON, amount=100 + i) for i in range(10)]
        answers = await asyncio.gather(*(present(limited, limited.http, m) for m in mandates))
        async with limited.http.get(
            f"{limited.ops_url}/v1/operations", headers=admin_headers()
        ) as response:
            listed = (await response.json())["operations"]
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] + [429] * 9, statuses
    assert {body["code"] for status, body in answers if status == 429} == {"rate_limited"}
    assert len(listed) == 1


async def test_a_replacement_agent_presents_the_receipt_to_learn_the_operation_ended(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Another agent of the tenant presents the first receipt opgate signed: opgate checks its
    own signature and answers the operation as it stands (settled, the provider's object) and
    a fresh receipt; a receipt signed by another key, altered, or of another tenant's agent is
    refused."""
    status, answer = await present(gate, gate.http, closed_mandate(PERSON))
    assert status == 201, answer
    first = answer["receipt"]
    assert await send_exactly(gate, gate.http, answer["operation"]["request"]) == 200

    status, known = await present_receipt(gate, first, token=SECOND_AGENT_TOKEN)
    assert status == 200, known
    op = known["operation"]["operation"]
    assert (known["settled"], op["status"]) == (True, "confirmed")
    assert op["operation_id"] == answer["operation"]["operation"]["operation_id"]
    claims = await receipt_claims(gate, known["receipt"])
    assert (claims["status"], claims["payment_id"]) == ("Success", fault_provider.effects[0].id)
    # AP2's reference of the presentation the operation was made from, as first signed
    assert claims["reference"] == (await receipt_claims(gate, first))["reference"]

    header, payload, signature = first.split(".")
    other_key = ECKey.generate_key("P-256")
    forged = jws.serialize_compact(
        json.loads(base64.urlsafe_b64decode(header + "==")),
        base64.urlsafe_b64decode(payload + "=="),
        other_key,
    )
    flipped = payload[:-2] + ("AA" if payload[-2:] != "AA" else "BB")
    altered = ".".join((header, flipped, signature))
    for receipt in (forged, altered, "not-a-jws"):
        status, refused = await present_receipt(gate, receipt)
        assert (status, refused["code"]) == (403, "mandate_receipt_invalid"), refused
    status, refused = await present_receipt(gate, first, token=OTHER_TENANT_TOKEN)
    assert (status, refused["code"]) == (404, "operation_unknown"), refused


async def test_a_request_one_unit_off_the_mandate_is_refused(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """The operation holds what the person signed: 2501 where 2500 was signed is refused."""
    _, answer = await present(gate, gate.http, closed_mandate(PERSON, amount=2500))
    request = answer["operation"]["request"]
    request["form"]["amount"] = "2501"
    assert await send_exactly(gate, gate.http, request) == 422
    assert fault_provider.effects == []


def _forged_alg_none() -> str:
    token = closed_mandate(PERSON)
    _header, payload, _sig = token.split("~", 1)[0].split(".")
    header = "eyJhbGciOiJub25lIiwia2lkIjoic3VyZmFjZS0yMDI2In0"  # {"alg":"none","kid":...}
    return f"{header}.{payload}.~"


def _swapped_disclosure() -> str:
    mine = closed_mandate(PERSON).split("~")
    theirs = closed_mandate(PERSON, payee_id="acct_attacker").split("~")
    return f"{mine[0]}~{theirs[1]}~"


@pytest.mark.parametrize(
    ("scenario", "mandate", "token", "code"),
    [
        (
            "untrusted key",
            lambda: closed_mandate(Signer("surface-2026")),
            AGENT_TOKEN,
            "mandate_invalid",
        ),
        (
            "unknown kid",
            lambda: closed_mandate(Signer("elsewhere")),
            AGENT_TOKEN,
            "mandate_issuer_unknown",
        ),
        (
            "other tenant",
            lambda: closed_mandate(PERSON),
            OTHER_TENANT_TOKEN,
            "mandate_issuer_unknown",
        ),
        ("alg none", _forged_alg_none, AGENT_TOKEN, "mandate_invalid"),
        ("swapped disclosure", _swapped_disclosure, AGENT_TOKEN, "mandate_invalid"),
        ("expired", lambda: closed_mandate(PERSON, exp=1), AGENT_TOKEN, "mandate_expired"),
        (
            "payee paid elsewhere",
            lambda: closed_mandate(PERSON, payee_id="acct_other"),
            AGENT_TOKEN,
            "mandate_mismatch",
        ),
        (
            "lower-case currency",
            lambda: closed_mandate(PERSON, currency="usd"),
            AGENT_TOKEN,
            "mandate_invalid",
        ),
        (
            "unknown constraint",
            lambda: present_under(
                open_mandate(PERSON, AGENT, [{"type": "com.example.tier", "tier": "gold"}]),
                AGENT,
                closed_payment(),
                aud=AUDIENCE,
            ),
            AGENT_TOKEN,
            "mandate_constraint_failed",
        ),
        (
            "binding for another audience",
            lambda: present_under(
                open_mandate(PERSON, AGENT, []), AGENT, closed_payment(), aud="elsewhere"
            ),
            AGENT_TOKEN,
            "mandate_invalid",
        ),
    ],
)
async def test_every_refusal_is_a_code_with_a_signed_error_receipt(
    gate: Opgate,
    fault_provider: FaultProvider,
    database_url: str,
    scenario: str,
    mandate: Any,
    token: str,
    code: str,
) -> None:
    """Each attack or mistake is refused 403 with its code and an AP2 error receipt, creates
    no operation, and is audited with the rule ``mandate``, its code, the mandate's digest,
    the presentation as received and the JWKS of the issuer its ``kid`` names."""
    presented = mandate()
    status, refused = await present(gate, gate.http, presented, token=token)
    assert (status, refused["code"]) == (403, code), refused
    claims = await receipt_claims(gate, refused["receipt"])
    assert (claims["result"], claims["opgate_code"]) == ("error", code)
    assert fault_provider.requests == []
    final_jwt = presented.split("~~")[-1].split("~", 1)[0]
    known_kid = scenario not in ("unknown kid", "other tenant")
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM operations") == 0

        async def audited() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM audit_log WHERE record::jsonb->>'rule' = 'mandate' "
                    "AND record::jsonb->>'reason' = $1",
                    code,
                )
            )

        await _eventually(audited)
        kept = json.loads(
            await conn.fetchval(
                "SELECT record FROM audit_log WHERE record::jsonb->>'reason' = $1", code
            )
        )["mandate"]
        assert kept is not None, "the refused presentation is not kept"
        assert (kept["digest"], kept["presentation"]) == (identity(final_jwt), presented)
        assert kept["issuer_jwks"] == (PERSON.jwks if known_kid else None)
        assert claims["reference"] == kept["reference"]
    finally:
        await conn.close()


AGENT = Signer("agent-key")


async def _eventually(check: Callable[[], Awaitable[bool]], seconds: float = 10.0) -> None:
    """Poll a database condition, bounded: the audit writer stores records in batches."""
    try:
        async with asyncio.timeout(seconds):
            while not await check():  # noqa: ASYNC110 (a database row: nothing signals it)
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {seconds} s") from None


async def test_the_mandate_and_its_keys_are_kept_with_the_audit_record(
    gate: Opgate, database_url: str
) -> None:
    """The record of a presentation holds the mandate as received and the issuer's JWKS."""
    mandate = closed_mandate(PERSON)
    status, answer = await present(gate, gate.http, mandate)
    assert status == 201
    conn = await asyncpg.connect(database_url)
    try:

        async def kept() -> bool:
            row = await conn.fetchval(
                "SELECT record FROM audit_log WHERE record::jsonb->'mandate'->>'digest' = $1",
                answer["mandate_digest"],
            )
            if row is None:
                return False
            record = json.loads(row)
            return bool(
                record["mandate"]["presentation"] == mandate
                and record["mandate"]["issuer_jwks"] == PERSON.jwks
            )

        await _eventually(kept)
    finally:
        await conn.close()


async def test_a_revoked_mandate_approves_nothing_more(gate: Opgate) -> None:
    """Revoked by its digest through the operations API: its unsent operation is revoked and
    the mandate presented again is refused mandate_revoked."""
    mandate = closed_mandate(PERSON)
    _, answer = await present(gate, gate.http, mandate)
    digest = answer["mandate_digest"]
    async with gate.http.post(
        f"{gate.ops_url}/v1/mandates/{digest}/revoke",
        json={"reason": "the person withdrew consent"},
        headers=admin_headers(),
    ) as response:
        revoked = await response.json()
    assert response.status == 200
    assert revoked["revoked"] == [answer["operation"]["operation"]["operation_id"]]
    status, refused = await present(gate, gate.http, mandate)
    assert (status, refused["code"]) == (403, "mandate_revoked")


async def test_an_open_mandate_allows_one_payment_without_recurrence(gate: Opgate) -> None:
    """Without agent_recurrence an open mandate approves one closed mandate, not a second."""
    open_token = open_mandate(PERSON, AGENT, [])
    first = present_under(
        open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=await issued_nonce(gate, gate.http)
    )
    second = present_under(
        open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=await issued_nonce(gate, gate.http)
    )
    assert (await present(gate, gate.http, first))[0] == 201
    status, refused = await present(gate, gate.http, second)
    assert (status, refused["code"]) == (403, "mandate_exhausted")


async def test_twenty_presentations_over_two_processes_make_one_effect_and_hold_a_budget(
    database_url: str, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """Two opgate processes, one database. One closed mandate presented 20 times at once (10
    to each) names one operation; each presenter then sends its request: one effect at the
    provider. Then 20 closed mandates of 400 under one open mandate with a 2,000 budget and 20
    uses, at once over both: exactly 5 are accepted, 15 refused mandate_exhausted. Then ten
    closed mandates answering one nonce, at once over both: one accepted, nine
    mandate_nonce_used."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "fault.yaml").write_text(mandate_policy())
    settings = mandate_settings(tmp_path)
    environments = [
        process_env(
            database_url,
            policies,
            {"fault": fault_provider.url},
            OPGATE_INSTANCE_ID=name,
            OPGATE_BACKGROUND_INTERVAL_SECONDS="3600",
            OPGATE_POLICY_RELOAD_INTERVAL_SECONDS="0",
            OPGATE_MANDATE_ISSUERS=json.dumps(settings["mandate_issuers"]),
            OPGATE_MANDATE_AUDIENCE=AUDIENCE,
            OPGATE_RECEIPT_KEY_FILE=str(settings["receipt_key_file"]),
        )
        for name in ("mandate-a", "mandate-b")
    ]
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        opgate_process(environments[0]) as gate_a,
        opgate_process(environments[1]) as gate_b,
        aiohttp.ClientSession(trust_env=False, connector=connector) as http,
    ):
        gates = (gate_a, gate_b)
        mandate = closed_mandate(PERSON, amount=700)
        answers = await asyncio.gather(*(present(gates[i % 2], http, mandate) for i in range(20)))
        assert sorted(status for status, _ in answers) == [200] * 19 + [201]
        assert len({a["operation"]["operation"]["operation_id"] for _, a in answers}) == 1
        await asyncio.gather(
            *(
                send_exactly(gates[i % 2], http, a["operation"]["request"])
                for i, (_, a) in enumerate(answers)
            )
        )
        assert len(fault_provider.effects) == 1

        budget = [
            {"type": "payment.budget", "max": 2000, "currency": "USD"},
            {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 20},
        ]
        open_token = open_mandate(PERSON, AGENT, budget)
        closed = [
            present_under(
                open_token,
                AGENT,
                closed_payment(amount=400),
                aud=AUDIENCE,
                nonce=await issued_nonce(gates[i % 2], http),
            )
            for i in range(20)
        ]
        results = await asyncio.gather(
            *(present(gates[i % 2], http, c) for i, c in enumerate(closed))
        )
        codes = sorted(str(status) if status == 201 else body["code"] for status, body in results)
        assert codes == ["201"] * 5 + ["mandate_exhausted"] * 15, codes

        # one nonce, ten different closed mandates answering it, at once over both processes
        # (issued by one, presented to both): one is accepted, nine are replays
        roomy = [
            {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 20}
        ]
        open_token = open_mandate(PERSON, AGENT, roomy)
        nonce = await issued_nonce(gate_a, http)
        closed = [
            present_under(open_token, AGENT, closed_payment(amount=100), aud=AUDIENCE, nonce=nonce)
            for _ in range(10)
        ]
        results = await asyncio.gather(
            *(present(gates[i % 2], http, c) for i, c in enumerate(closed))
        )
    codes = sorted(str(status) if status == 201 else body["code"] for status, body in results)
    assert codes == ["201"] + ["mandate_nonce_used"] * 9, codes
    conn = await asyncpg.connect(database_url)
    try:
        spent = await conn.fetchval(
            "SELECT sum(amount) FROM operations WHERE approval_ref LIKE 'ap2:%;open:%' "
            "AND amount = 400"
        )
    finally:
        await conn.close()
    assert spent == 2000


async def test_a_key_binding_answers_a_nonce_opgate_issued_to_this_agent(
    gate: Opgate, database_url: str
) -> None:
    """A nonce opgate never issued, one it issued to another agent, or one past its expiry is
    mandate_nonce_unknown and creates nothing; the agent's own fresh nonce is accepted."""
    open_token = open_mandate(PERSON, AGENT, [])

    def chain(nonce: str) -> str:
        return present_under(open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=nonce)

    status, refused = await present(gate, gate.http, chain("made-up-by-the-agent"))
    assert (status, refused["code"]) == (403, "mandate_nonce_unknown"), refused
    others = await issued_nonce(gate, gate.http, token=SECOND_AGENT_TOKEN)
    status, refused = await present(gate, gate.http, chain(others))
    assert (status, refused["code"]) == (403, "mandate_nonce_unknown"), refused
    stale = await issued_nonce(gate, gate.http)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "UPDATE mandate_nonces SET expires_at = now() - interval '1 second' WHERE nonce = $1",
            stale,
        )
        status, refused = await present(gate, gate.http, chain(stale))
        assert (status, refused["code"]) == (403, "mandate_nonce_unknown"), refused
        assert "expired" in refused["detail"]
        assert await conn.fetchval("SELECT count(*) FROM operations") == 0
    finally:
        await conn.close()
    status, answer = await present(gate, gate.http, chain(await issued_nonce(gate, gate.http)))
    assert status == 201, answer


async def test_a_nonce_answers_one_presentation(gate: Opgate) -> None:
    """A nonce used by one closed mandate cannot carry another (mandate_nonce_used); the very
    same presentation again names its operation (200), as any replayed mandate does."""
    recurring = [
        {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 5}
    ]
    open_token = open_mandate(PERSON, AGENT, recurring)
    nonce = await issued_nonce(gate, gate.http)
    first = present_under(open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=nonce)
    second = present_under(open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=nonce)
    status, created = await present(gate, gate.http, first)
    assert status == 201, created
    status, refused = await present(gate, gate.http, second)
    assert (status, refused["code"]) == (403, "mandate_nonce_used"), refused
    status, again = await present(gate, gate.http, first)
    assert status == 200, again
    assert (
        again["operation"]["operation"]["operation_id"]
        == (created["operation"]["operation"]["operation_id"])
    )


MERCHANT = Signer("merchant-key")


async def test_a_payment_is_bound_to_the_checkout_presented_with_it(
    gate: Opgate, database_url: str
) -> None:
    """With the person's closed Checkout Mandate, a payment whose transaction_id is not its
    checkout_hash is mandate_mismatch naming transaction_id; the one that is becomes the
    operation, and the checkout mandate is kept with the audit record."""
    jwt = checkout_jwt(MERCHANT)
    checkout = closed_checkout(PERSON, jwt)
    other = closed_mandate(PERSON, transaction_id=digest(checkout_jwt(MERCHANT)))
    status, refused = await present(gate, gate.http, other, checkout_mandate=checkout)
    assert (status, refused["code"], refused["field"]) == (
        403,
        "mandate_mismatch",
        "transaction_id",
    )
    paid = closed_mandate(PERSON, transaction_id=digest(jwt))
    status, answer = await present(gate, gate.http, paid, checkout_mandate=checkout)
    assert status == 201, answer
    conn = await asyncpg.connect(database_url)
    try:

        async def kept() -> bool:
            row = await conn.fetchval(
                "SELECT record FROM audit_log WHERE record::jsonb->'mandate'->>'digest' = $1",
                answer["mandate_digest"],
            )
            return row is not None and json.loads(row)["mandate"]["checkout"]["presentation"] == (
                checkout
            )

        await _eventually(kept)
    finally:
        await conn.close()


async def test_a_refused_checkout_mandate_is_kept_with_the_refusal(
    gate: Opgate, database_url: str
) -> None:
    """A Checkout Mandate signed under the person's kid by another key is refused
    mandate_invalid, and its record keeps both presentations, their digests and the JWKS."""
    jwt = checkout_jwt(MERCHANT)
    checkout = closed_checkout(Signer(PERSON.kid), jwt)
    paid = closed_mandate(PERSON, transaction_id=digest(jwt))
    status, refused = await present(gate, gate.http, paid, checkout_mandate=checkout)
    assert (status, refused["code"]) == (403, "mandate_invalid"), refused
    conn = await asyncpg.connect(database_url)
    try:

        async def kept() -> dict[str, Any] | None:
            row = await conn.fetchval(
                "SELECT record FROM audit_log WHERE record::jsonb->>'reason' = 'mandate_invalid'"
            )
            return None if row is None else json.loads(row)

        await _eventually(lambda: _some(kept()))
        record = await kept()
        assert record is not None
        mandate = record["mandate"]
        assert (mandate["digest"], mandate["presentation"]) == (identity(paid.split("~")[0]), paid)
        assert mandate["checkout"]["presentation"] == checkout
        assert mandate["checkout"]["digest"] == identity(checkout.split("~")[0])
        assert mandate["checkout"]["issuer_jwks"] == PERSON.jwks
    finally:
        await conn.close()


async def test_a_refused_presentation_is_kept_as_the_redaction_settings_say(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    tmp_path: Path,
    database_url: str,
) -> None:
    """With ``presentation`` among ``audit_redact_fields``, a refused mandate's record keeps
    its digest and issuer's JWKS and redacts the presentation, as every record is redacted."""
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    expired = closed_mandate(PERSON, exp=1)
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        audit_redact_fields=["presentation"],
        **mandate_settings(tmp_path),
    ) as running:
        status, refused = await present(running, running.http, expired)
    assert (status, refused["code"]) == (403, "mandate_expired"), refused
    conn = await asyncpg.connect(database_url)
    try:

        async def kept() -> dict[str, Any] | None:
            row = await conn.fetchval(
                "SELECT record FROM audit_log WHERE record::jsonb->>'reason' = 'mandate_expired'"
            )
            return None if row is None else json.loads(row)

        await _eventually(lambda: _some(kept()))
        record = await kept()
        assert record is not None
        mandate = record["mandate"]
        assert mandate["digest"] == identity(expired.split("~")[0])
        assert (mandate["presentation"], mandate["issuer_jwks"]) == ("[REDACTED]", PERSON.jwks)
    finally:
        await conn.close()


async def _some(value: Awaitable[object]) -> bool:
    return await value is not None


async def test_an_agent_pays_a_checkout_it_closed_under_the_persons_open_mandates(
    gate: Opgate,
) -> None:
    """Human not present: the person's open Checkout and Payment Mandates (line items, and
    payment.reference naming the open checkout); the agent closes both answering one opgate
    nonce: accepted. Line items the person did not allow are mandate_constraint_failed naming
    checkout.line_items; the two mandates answering different nonces are mandate_invalid."""
    shoe = {
        "type": "checkout.line_items",
        "items": [
            {"id": "shoe", "acceptable_items": [{"id": "sku_shoe", "title": "Shoe"}], "quantity": 1}
        ],
    }
    open_checkout_token = open_checkout(PERSON, AGENT, [shoe])
    reference = {
        "type": "payment.reference",
        "conditional_transaction_id": digest(open_checkout_token),
    }
    open_payment = open_mandate(PERSON, AGENT, [reference])

    async def presented(line_items: list[tuple[str, int]], nonces: tuple[str, str]) -> Any:
        jwt = checkout_jwt(MERCHANT, line_items=line_items)
        checkout = present_under(
            open_checkout_token, AGENT, closed_checkout_content(jwt), aud=AUDIENCE, nonce=nonces[0]
        )
        payment = present_under(
            open_payment,
            AGENT,
            closed_payment(transaction_id=digest(jwt)),
            aud=AUDIENCE,
            nonce=nonces[1],
        )
        return await present(gate, gate.http, payment, checkout_mandate=checkout)

    nonce = await issued_nonce(gate, gate.http)
    status, refused = await presented([("sku_hat", 1)], (nonce, nonce))
    assert (status, refused["code"], refused["constraint"]) == (
        403,
        "mandate_constraint_failed",
        "checkout.line_items",
    )
    status, refused = await presented(
        [("sku_shoe", 1)], (nonce, await issued_nonce(gate, gate.http))
    )
    assert (status, refused["code"]) == (403, "mandate_invalid"), refused
    status, answer = await presented([("sku_shoe", 1)], (nonce, nonce))
    assert status == 201, answer


async def test_a_nonce_no_issued_one_can_be_is_refused_before_the_store(gate: Opgate) -> None:
    """A key binding answering a nonce with a bidi control or a character outside base64url is
    mandate_nonce_unknown (403) before the nonce's statement, and one with a NUL is refused
    too (the payload's own NUL guard comes first; it reached the statement: 500); nothing is
    created, and an issued nonce still opens it."""
    open_token = open_mandate(PERSON, AGENT, [])
    expected = {
        "n\x00" + "a" * 41: "mandate_invalid",
        "n\u202e" + "a" * 41: "mandate_nonce_unknown",
        "n.b" + "a" * 40: "mandate_nonce_unknown",
    }
    for nonce, code in expected.items():
        presented = present_under(open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=nonce)
        status, refused = await present(gate, gate.http, presented)
        assert (status, refused["code"]) == (403, code), (nonce, refused["detail"])
    issued = await issued_nonce(gate, gate.http)
    accepted = present_under(open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=issued)
    assert (await present(gate, gate.http, accepted))[0] == 201


async def revoke(gate: Opgate, mandate_digest: str) -> dict[str, Any]:
    """The operations API's answer to revoking the mandate ``mandate_digest``."""
    async with gate.http.post(
        f"{gate.ops_url}/v1/mandates/{mandate_digest}/revoke",
        json={"reason": "the person withdrew consent"},
        headers=admin_headers(),
    ) as response:
        assert response.status == 200
        revoked: dict[str, Any] = await response.json()
        return revoked


def operation_id(answer: dict[str, Any]) -> str:
    value: str = answer["operation"]["operation"]["operation_id"]
    return value


async def test_a_closed_mandates_twin_is_the_same_operation(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """The twin of a presented closed mandate (its signature (R, n - S)) is answered as the
    mandate replayed: the same operation (200), never a second payment."""
    mandate = closed_mandate(PERSON)
    status, first = await present(gate, gate.http, mandate)
    assert status == 201, first
    assert await send_exactly(gate, gate.http, first["operation"]["request"]) == 200
    status, again = await present(gate, gate.http, twin(mandate))
    assert status == 200, again
    assert operation_id(again) == operation_id(first)
    assert again["mandate_digest"] == first["mandate_digest"]
    assert len(fault_provider.effects) == 1


async def test_an_open_mandates_twin_gets_no_fresh_budget(gate: Opgate) -> None:
    """A closed mandate under the twin of an open mandate counts against the open mandate's
    occurrences: without agent_recurrence, the second payment is refused mandate_exhausted."""
    open_token = open_mandate(PERSON, AGENT, [])
    first = present_under(
        open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=await issued_nonce(gate, gate.http)
    )
    second = present_under(
        twin(open_token),
        AGENT,
        closed_payment(),
        aud=AUDIENCE,
        nonce=await issued_nonce(gate, gate.http),
    )
    assert (await present(gate, gate.http, first))[0] == 201
    status, refused = await present(gate, gate.http, second)
    assert (status, refused.get("code")) == (403, "mandate_exhausted"), refused


async def test_a_revoked_mandates_twin_is_refused_as_revoked(gate: Opgate) -> None:
    """Revoked by the digest opgate answered, a mandate's twin is refused mandate_revoked, and
    so is a closed mandate under the twin of a revoked open mandate."""
    mandate = closed_mandate(PERSON)
    _, answer = await present(gate, gate.http, mandate)
    await revoke(gate, answer["mandate_digest"])
    status, refused = await present(gate, gate.http, twin(mandate))
    assert (status, refused.get("code")) == (403, "mandate_revoked"), refused

    recurring = [
        {"type": "payment.agent_recurrence", "frequency": "ON_DEMAND", "max_occurrences": 5}
    ]
    open_token = open_mandate(PERSON, AGENT, recurring)
    first = present_under(
        open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=await issued_nonce(gate, gate.http)
    )
    _, answer = await present(gate, gate.http, first)
    await revoke(gate, identity(open_token.split("~", 1)[0]))
    second = present_under(
        twin(open_token),
        AGENT,
        closed_payment(),
        aud=AUDIENCE,
        nonce=await issued_nonce(gate, gate.http),
    )
    status, refused = await present(gate, gate.http, second)
    assert (status, refused.get("code")) == (403, "mandate_revoked"), refused


def _as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """opgate keying a mandate as it did before its identity was its low-S form: by the digest
    of its text as presented (and of that text only)."""

    def presented_text(issuer_signed_jwt: str) -> mandates_api.MandateIdentity:
        return mandates_api.MandateIdentity(digest(issuer_signed_jwt), digest(issuer_signed_jwt))

    monkeypatch.setattr(mandates_api, "mandate_identity", presented_text, raising=False)


async def test_records_made_under_a_high_s_spelling_still_hold(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation approved, and a revocation made, under the digest of a high-S text (as
    opgate keyed them before) hold for its low-S twin: the same operation, then revoked."""
    mandate = high_s(closed_mandate(PERSON))
    _as_before(monkeypatch)
    status, before = await present(gate, gate.http, mandate)
    assert status == 201, before
    assert before["mandate_digest"] == digest(mandate.split("~", 1)[0])
    monkeypatch.undo()

    status, again = await present(gate, gate.http, twin(mandate))
    assert status == 200, again
    assert operation_id(again) == operation_id(before)
    status, again = await present(gate, gate.http, mandate)
    assert status == 200, again
    assert operation_id(again) == operation_id(before)

    revoked = await revoke(gate, before["mandate_digest"])
    assert revoked["operations"] == [operation_id(before)]
    status, refused = await present(gate, gate.http, twin(mandate))
    assert (status, refused.get("code")) == (403, "mandate_revoked"), refused


async def test_an_open_mandates_uses_under_a_high_s_spelling_still_count(
    gate: Opgate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uses of an open mandate counted under the digest of its high-S text (as opgate counted
    them before) count for its low-S twin: without agent_recurrence, no second payment."""
    open_token = high_s(open_mandate(PERSON, AGENT, []))
    first = present_under(
        open_token, AGENT, closed_payment(), aud=AUDIENCE, nonce=await issued_nonce(gate, gate.http)
    )
    _as_before(monkeypatch)
    assert (await present(gate, gate.http, first))[0] == 201
    monkeypatch.undo()
    second = present_under(
        twin(open_token),
        AGENT,
        closed_payment(),
        aud=AUDIENCE,
        nonce=await issued_nonce(gate, gate.http),
    )
    status, refused = await present(gate, gate.http, second)
    assert (status, refused.get("code")) == (403, "mandate_exhausted"), refused
