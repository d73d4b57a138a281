"""The payee a person approved reaches the provider request: the policy names, per call, the
parameters that carry a mandate's payee, instrument and reference (``mandate``), and the
operation a mandate creates approves exactly those values. A call that cannot carry the payee
is refused, not approved loosely; an open mandate is always key-bound."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from pydantic import ValidationError

from proxy.mandates.ap2 import MandateCode, MandateRefusal, MandateTerms, approved_params
from proxy.mandates.chain import Expectation, TrustedKey, verify_presentation
from proxy.mandates.sdjwt import ClaimWithheld, SdJwtInvalid
from proxy.policy.model import Rule
from tests.support.fault_provider import FaultProvider
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    mandate_policy,
    mandate_settings,
    present,
    send_exactly,
)
from tests.support.mandates import (
    Signer,
    closed_mandate,
    closed_payment,
    compact,
    open_mandate,
    person_claims,
    present_under,
)
from tests.support.opgate import Opgate, StartOpgate, fault_policy

AGENT = Signer("agent-key")


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as running:
        yield running


async def _operations(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM operations"))
    finally:
        await conn.close()


async def test_a_call_whose_policy_names_no_payee_parameter_is_refused(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    tmp_path: Path,
    database_url: str,
) -> None:
    """A refund (its rule names no parameter carrying a payee: the charge decides who is
    paid) presented with a payment mandate is refused approval_not_sendable, nothing created:
    the agent would otherwise choose which charge the person's approval refunds."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as running:
        status, answer = await present(
            running,
            running.http,
            closed_mandate(PERSON),
            action="refund.create",
            params={"charge": "ch_someone_elses"},
        )
    assert (status, answer["code"]) == (422, "approval_not_sendable"), answer
    assert await _operations(database_url) == 0
    assert fault_provider.requests == []


@pytest.mark.parametrize(
    ("scenario", "params", "field"),
    [
        ("another payee", {"destination": "acct_attacker"}, "payee"),
        ("another card", {"source": "pm_stolen"}, "payment_instrument"),
        ("another reference", {"reference": "order-1"}, "reference"),
    ],
)
async def test_the_agent_cannot_choose_another_payee_instrument_or_reference(
    gate: Opgate, database_url: str, scenario: str, params: dict[str, Any], field: str
) -> None:
    """Params naming another payee, payment instrument or reference than the mandate's are
    mandate_mismatch naming which, nothing created."""
    status, answer = await present(gate, gate.http, closed_mandate(PERSON), params=params)
    assert (status, answer["code"], answer["field"]) == (403, "mandate_mismatch", field), scenario
    assert await _operations(database_url) == 0


async def test_the_mandates_values_are_approved_and_the_gate_holds_them(
    gate: Opgate, fault_provider: FaultProvider
) -> None:
    """Repeating the mandate's own payee is accepted; the request opgate answers carries the
    mandate's payee, card and reference; the same request sending another destination is
    refused at the gate and the provider sees nothing; the approved one goes through once."""
    mandate = closed_mandate(PERSON, transaction_id="chk_42")
    status, answer = await present(
        gate, gate.http, mandate, params={"destination": "acct_merchant"}
    )
    assert status == 201, answer
    request = answer["operation"]["request"]
    form = request["form"]
    assert (form["destination"], form["source"], form["reference"]) == (
        "acct_merchant",
        "pm_card",
        "chk_42",
    )
    redirected = {**request, "form": {**form, "destination": "acct_attacker"}}
    assert await send_exactly(gate, gate.http, redirected) == 422
    assert fault_provider.effects == []
    assert await send_exactly(gate, gate.http, request) == 200
    assert len(fault_provider.effects) == 1


def _terms(instrument_id: str | None = "pm_card") -> MandateTerms:
    return MandateTerms(
        reference="r",
        closed_jwt="j",
        issuer="surface",
        subject="alice",
        payee_id="acct_merchant",
        amount=100,
        currency="USD",
        transaction_id="chk_1",
        expires_at=None,
        open_use=None,
        instrument_id=instrument_id,
    )


def test_a_mandate_naming_no_instrument_id_is_refused_where_the_call_carries_one() -> None:
    """A call that carries the instrument cannot be approved by a mandate whose instrument
    has no id: refused mandate_invalid, not sent with whatever the agent puts there."""
    refused = approved_params(_terms(None), {"payee": "to", "payment_instrument": "card"}, {})
    assert isinstance(refused, MandateRefusal)
    assert refused.code is MandateCode.INVALID


def test_only_params_a_rule_approves_can_carry_a_mandates_terms() -> None:
    """``mandate`` names params of the rule, distinct ones, on a rule reading an amount."""
    base: dict[str, Any] = {"name": "p", "method": "POST", "path": "/v1/p", "amount": "amount"}
    Rule.model_validate({**base, "params": ["to"], "mandate": {"payee": "to"}})
    for bad in (
        {**base, "params": [], "mandate": {"payee": "to"}},
        {**base, "params": ["to"], "mandate": {"payee": "to", "reference": "to"}},
        {**base, "amount": None, "params": ["to"], "mandate": {"payee": "to"}},
    ):
        with pytest.raises(ValidationError):
            Rule.model_validate(bad)


def _expect() -> Expectation:
    return Expectation(AUDIENCE, int(time.time()))


def test_an_open_mandate_is_always_key_bound() -> None:
    """An open mandate naming no agent key, or withholding it, is refused: nobody could be
    told apart as its agent. Presented alone (no closed mandate under it) it approves nothing
    either (ap2.terms_of)."""
    trusted = {PERSON.kid: TrustedKey("surface", PERSON.public_jwk)}
    unbound, disclosures = PERSON.sd_jwt(
        person_claims({"vct": "mandate.payment.open.1", "constraints": []})
    )
    chain = present_under(compact(unbound, disclosures), AGENT, closed_payment(), aud=AUDIENCE)
    with pytest.raises(SdJwtInvalid, match="names no agent key"):
        verify_presentation(chain, trusted, _expect())
    hidden = open_mandate(PERSON, AGENT, [], disclose=("constraints", "cnf"))
    jwt, constraints, _cnf, _ = hidden.split("~")
    chain = present_under(f"{jwt}~{constraints}~", AGENT, closed_payment(), aud=AUDIENCE)
    with pytest.raises(ClaimWithheld) as withheld:
        verify_presentation(chain, trusted, _expect())
    assert withheld.value.claim == "cnf"


def test_a_direct_payment_leaves_the_params_that_would_pay_someone_else_absent() -> None:
    """With ``payee: account`` no parameter carries the payee; a param listed ``absent`` (a
    connected account to pay on behalf of) set by the agent is mandate_mismatch naming the
    payee, and the instrument is still the mandate's."""
    refused = approved_params(
        _terms(), {"payment_instrument": "pm"}, {"on_behalf_of": "acct_x"}, ["on_behalf_of"]
    )
    assert isinstance(refused, MandateRefusal)
    assert (refused.code, refused.field) == (MandateCode.MISMATCH, "payee")
    assert approved_params(_terms(), {"payment_instrument": "pm"}, {}, ["on_behalf_of"]) == {
        "pm": "pm_card"
    }
