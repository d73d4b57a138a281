"""Presentations verified: a person's closed mandate, and AP2's open-to-closed chain, with the
attacks the issue lists (untrusted key, dropped or swapped disclosure, another audience)."""

from __future__ import annotations

import time

import pytest

from proxy.mandates.chain import (
    Expectation,
    IssuerUnknown,
    TrustedKey,
    presented_parts,
    verify_presentation,
)
from proxy.mandates.sdjwt import ClaimWithheld, SdJwtExpired, SdJwtInvalid, b64url_digest
from tests.support.mandates import (
    Signer,
    closed_mandate,
    closed_payment,
    compact,
    key_binding,
    open_mandate,
    person_claims,
    present_under,
)

AUD = "opgate.test"


@pytest.fixture
def person() -> Signer:
    return Signer("surface-1")


@pytest.fixture
def agent() -> Signer:
    return Signer("agent-1")


def trusted(*signers: Signer) -> dict[str, TrustedKey]:
    return {s.kid: TrustedKey("surface", s.public_jwk) for s in signers}


def expect(now: int | None = None) -> Expectation:
    return Expectation(audience=AUD, now=now if now is not None else int(time.time()))


def test_a_closed_mandate_verifies_to_its_claims(person: Signer) -> None:
    """A closed Payment Mandate from a trusted surface verifies, payee disclosed."""
    verified = verify_presentation(closed_mandate(person), trusted(person), expect())
    assert verified.closed is None
    assert verified.issuer == "surface"
    assert verified.final["payee"]["id"] == "acct_merchant"
    assert verified.final["payment_amount"] == {"amount": 2500, "currency": "USD"}


def test_the_reference_is_the_final_sd_jwt_hashed_as_sd_hash(person: Signer) -> None:
    """AP2's receipt reference: base64url SHA-256 of the presented SD-JWT."""
    token = closed_mandate(person)
    assert verify_presentation(token, trusted(person), expect()).reference == b64url_digest(token)


def test_an_untrusted_signer_is_unknown(person: Signer) -> None:
    """A mandate signed by a key no trusted issuer holds is refused as issuer-unknown."""
    stranger = Signer("surface-1")  # the same kid, another key: the signature fails
    with pytest.raises(SdJwtInvalid, match="does not verify"):
        verify_presentation(closed_mandate(stranger), trusted(person), expect())
    with pytest.raises(IssuerUnknown):
        verify_presentation(closed_mandate(Signer("elsewhere")), trusted(person), expect())


def test_a_dropped_disclosure_is_refused_naming_the_claim(person: Signer) -> None:
    """Without the payee's disclosure the mandate is refused, the payee named as withheld:
    not shown is never read as not there."""
    jwt = closed_mandate(person).split("~", 1)[0]
    with pytest.raises(ClaimWithheld) as refused:
        verify_presentation(f"{jwt}~", trusted(person), expect())
    assert refused.value.claim == "payee"


def test_a_swapped_disclosure_is_refused(person: Signer) -> None:
    """A disclosure from another mandate (another payee) matches no digest: refused."""
    mine = closed_mandate(person).split("~")
    theirs = closed_mandate(person, payee_id="acct_attacker").split("~")
    with pytest.raises(SdJwtInvalid):
        verify_presentation(f"{mine[0]}~{theirs[1]}~", trusted(person), expect())


def test_an_expired_mandate_is_expired(person: Signer) -> None:
    """A mandate past its exp is refused as expired."""
    token = closed_mandate(person)
    with pytest.raises(SdJwtExpired):
        verify_presentation(token, trusted(person), expect(now=int(time.time()) + 3600))


def test_an_open_mandate_and_the_agents_closed_one_verify(person: Signer, agent: Signer) -> None:
    """The agent's closed mandate, signed with the key the person named, verifies under it."""
    open_token = open_mandate(
        person, agent, [{"type": "payment.amount_range", "max": 5000, "currency": "USD"}]
    )
    chain = present_under(open_token, agent, closed_payment(), aud=AUD)
    verified = verify_presentation(chain, trusted(person), expect())
    assert verified.root["vct"] == "mandate.payment.open.1"
    assert verified.closed is not None
    assert verified.closed["vct"] == "mandate.payment.1"
    assert verified.reference == b64url_digest(chain.split("~~")[1])


def test_issuer_jwt_hash_binding_is_accepted(person: Signer, agent: Signer) -> None:
    """The delegate draft's issuer_jwt_hash binds the hop as sd_hash does."""
    open_token = open_mandate(person, agent, [])
    chain = present_under(open_token, agent, closed_payment(), aud=AUD, binding="issuer_jwt_hash")
    assert verify_presentation(chain, trusted(person), expect()).closed is not None


@pytest.mark.parametrize(
    ("scenario", "change", "message"),
    [
        ("another audience", {"aud": "elsewhere"}, "another audience"),
        ("an old binding", {"iat": int(time.time()) - 3600}, "older"),
        ("an intermediate typ", {"typ": "kb+sd-jwt+kb"}, "typ"),
    ],
)
def test_a_hop_for_another_verifier_or_time_is_refused(
    person: Signer, agent: Signer, scenario: str, change: dict[str, object], message: str
) -> None:
    """The closed mandate's aud, iat and typ are checked."""
    open_token = open_mandate(person, agent, [])
    args: dict[str, object] = {"aud": AUD, **change}
    chain = present_under(open_token, agent, closed_payment(), **args)  # type: ignore[arg-type]
    with pytest.raises(SdJwtInvalid, match=message):
        verify_presentation(chain, trusted(person), expect())


def test_a_hop_signed_by_another_agent_is_refused(person: Signer, agent: Signer) -> None:
    """Only the key the person named in cnf may sign under the open mandate."""
    open_token = open_mandate(person, agent, [])
    chain = present_under(open_token, Signer("thief"), closed_payment(), aud=AUD)
    with pytest.raises(SdJwtInvalid, match="does not verify"):
        verify_presentation(chain, trusted(person), expect())


def test_a_hop_bound_to_another_open_mandate_is_refused(person: Signer, agent: Signer) -> None:
    """A closed mandate made under one open mandate cannot be moved under another."""
    first = open_mandate(person, agent, [])
    second = open_mandate(person, agent, [{"type": "payment.budget", "max": 1, "currency": "USD"}])
    hop = present_under(second, agent, closed_payment(), aud=AUD).split("~~")[1]
    with pytest.raises(SdJwtInvalid, match="does not match"):
        verify_presentation(f"{first.removesuffix('~')}~~{hop}", trusted(person), expect())


def test_delegation_past_one_agent_is_refused(person: Signer, agent: Signer) -> None:
    """AP2 v0.2 defines no agent-to-agent delegation: three tokens are refused."""
    chain = present_under(open_mandate(person, agent, []), agent, closed_payment(), aud=AUD)
    with pytest.raises(SdJwtInvalid, match="past one agent"):
        verify_presentation(chain + "~x.y.z~", trusted(person), expect())


def test_a_holder_bound_closed_mandate_needs_its_key_binding(person: Signer, agent: Signer) -> None:
    """A closed mandate naming a holder key (cnf) needs an RFC 9901 KB-JWT for this verifier."""
    claims = person_claims({**closed_payment(), "cnf": {"jwk": agent.public_jwk}})
    jwt, disclosures = person.sd_jwt(claims)
    presentation = compact(jwt, disclosures)
    with pytest.raises(SdJwtInvalid, match="no key binding"):
        verify_presentation(presentation, trusted(person), expect())
    good = presentation + key_binding(agent, presentation, aud=AUD)
    assert verify_presentation(good, trusted(person), expect()).final["vct"] == "mandate.payment.1"
    other = presentation + key_binding(agent, presentation, aud="elsewhere")
    with pytest.raises(SdJwtInvalid, match="another audience"):
        verify_presentation(other, trusted(person), expect())
    stolen = presentation + key_binding(Signer("thief"), presentation, aud=AUD)
    with pytest.raises(SdJwtInvalid, match="does not verify"):
        verify_presentation(stolen, trusted(person), expect())


def test_the_nonce_the_agent_answered_is_given_back(person: Signer, agent: Signer) -> None:
    """The verified presentation names the nonce its key binding answered (the caller checks it
    is one opgate issued); a mandate with no key binding has none."""
    open_token = open_mandate(person, agent, [])
    chain = present_under(open_token, agent, closed_payment(), aud=AUD, nonce="n-opgate-1")
    assert verify_presentation(chain, trusted(person), expect()).nonce == "n-opgate-1"
    claims = person_claims({**closed_payment(), "cnf": {"jwk": agent.public_jwk}})
    jwt, disclosures = person.sd_jwt(claims)
    bound = compact(jwt, disclosures)
    bound += key_binding(agent, bound, aud=AUD, nonce="n-opgate-2")
    assert verify_presentation(bound, trusted(person), expect()).nonce == "n-opgate-2"
    assert verify_presentation(closed_mandate(person), trusted(person), expect()).nonce is None


@pytest.mark.parametrize("scenario", ["closed", "chain"])
def test_the_parts_of_a_presentation_are_those_it_verifies_to(
    person: Signer, agent: Signer, scenario: str
) -> None:
    """Read unverified (to keep a refused presentation), its JWTs, reference and kid are the
    verified mandate's own."""
    if scenario == "closed":
        text = closed_mandate(person)
    else:
        text = present_under(open_mandate(person, agent, []), agent, closed_payment(), aud=AUD)
    parts = presented_parts(text)
    verified = verify_presentation(text, trusted(person), expect())
    assert parts is not None
    assert (parts.root_jwt, parts.closed_jwt, parts.reference, parts.kid) == (
        verified.root_jwt,
        verified.closed_jwt,
        verified.reference,
        person.kid,
    )


@pytest.mark.parametrize("text", ["", "no separator", "a~~b~~c~", "é~"])
def test_what_does_not_split_has_no_parts(text: str) -> None:
    """A text that is not one presentation (no ``~``, two delegations, not ASCII) has none."""
    assert presented_parts(text) is None


def test_a_withheld_holder_key_does_not_lift_the_key_binding(person: Signer) -> None:
    """A closed mandate whose cnf (the holder's key) is selectively disclosable, presented
    without that disclosure and without a KB-JWT, is refused naming cnf: whether a key binding
    is required is decided by the signed mandate, never by what the presenter shows (RFC 9901:
    "Verifiers MUST NOT take into account whether the Holder has provided an SD-JWT+KB")."""
    holder = Signer("holder")
    claims = person_claims(closed_payment(cnf={"jwk": holder.public_jwk}))
    jwt, disclosures = person.sd_jwt(claims, disclose=("cnf",))
    with pytest.raises(ClaimWithheld) as refused:
        verify_presentation(f"{jwt}~", trusted(person), expect())
    assert refused.value.claim == "cnf"
    # shown whole, the key binding is required
    with pytest.raises(SdJwtInvalid, match="no key binding"):
        verify_presentation(compact(jwt, disclosures), trusted(person), expect())


def test_the_mandate_contents_own_expiry_is_checked(person: Signer, agent: Signer) -> None:
    """An agent's closed mandate whose content (delegate_payload) expired is refused as
    expired, as the token's own exp is."""
    past = int(time.time()) - 3600
    chain = present_under(open_mandate(person, agent, []), agent, closed_payment(exp=past), aud=AUD)
    with pytest.raises(SdJwtExpired):
        verify_presentation(chain, trusted(person), expect())


def test_a_fixed_claim_withheld_from_the_open_mandate_is_refused(
    person: Signer, agent: Signer
) -> None:
    """An open mandate fixing the payee (selectively disclosable), presented without it, is
    refused naming payee: unchanged could not compare what it cannot see, and the agent's
    closed mandate would pay anyone."""
    open_token = open_mandate(
        person,
        agent,
        [],
        disclose=("constraints", "payee"),
        payee={"id": "acct_merchant", "name": "Merchant Choice", "website": "https://m.example"},
    )
    jwt, constraints, _payee, _ = open_token.split("~")
    chain = present_under(
        f"{jwt}~{constraints}~",
        agent,
        closed_payment(payee_id="acct_attacker"),
        aud=AUD,
        binding="issuer_jwt_hash",
    )
    with pytest.raises(ClaimWithheld) as refused:
        verify_presentation(chain, trusted(person), expect())
    assert refused.value.claim == "payee"
