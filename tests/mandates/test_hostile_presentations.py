"""No presentation is a 500: hostile inputs at ``POST /_opgate/v1/mandates`` and at
``POST /_opgate/v1/mandates/receipts`` (JSON nested past any sane depth before a signature is
checked, times and dates out of range, huge numbers, truncated base64, odd Unicode) are each a
4xx problem with a stable code and an audit record, and create nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.mandates.ap2 import terms_of
from proxy.mandates.chain import Expectation, TrustedKey, verify_presentation
from proxy.mandates.checkout import checkout_of
from proxy.mandates.sdjwt import SdJwtInvalid
from tests.support.fault_provider import FaultProvider
from tests.support.mandate_gate import (
    AUDIENCE,
    PERSON,
    mandate_policy,
    mandate_settings,
    present,
)
from tests.support.mandates import (
    Signer,
    b64url,
    closed_mandate,
    closed_payment,
    compact,
    disclosure,
    open_mandate,
    person_claims,
    present_under,
)
from tests.support.opgate import AGENT_TOKEN, Opgate, StartOpgate

AGENT = Signer("agent-key")
DEEP = 6000  # ~13 KB of brackets once base64url-encoded: past Python's recursion limit


@pytest_asyncio.fixture(loop_scope="session")
async def gate(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(mandate_policy())
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url}, **mandate_settings(tmp_path)
    ) as running:
        yield running


def _segment(raw: str) -> str:
    return b64url(raw.encode("utf-8"))


def deep_header() -> str:
    """A JWS header of deeply nested JSON, under any signature."""
    header = '{"alg":"ES256","kid":"surface-2026","x":' + "[" * DEEP + "]" * DEEP + "}"
    jwt = closed_mandate(PERSON).split("~", 1)[0]
    _h, payload, signature = jwt.split(".")
    return f"{_segment(header)}.{payload}.{signature}~"


def deep_disclosure() -> str:
    """A disclosure (covered by no digest) of deeply nested JSON."""
    token = closed_mandate(PERSON)
    nested = '["salt","note",' + "[" * DEEP + "]" * DEEP + "]"
    return token + _segment(nested) + "~"


def old_execution_date() -> str:
    """A closed mandate under an open one with an execution window, dated the year 1 in +01:00
    (a date before the first representable UTC instant)."""
    window = {"type": "payment.execution_date", "not_before": "2026-01-01"}
    return present_under(
        open_mandate(PERSON, AGENT, [window]),
        AGENT,
        closed_payment(execution_date="0001-01-01T00:00:00+01:00"),
        aud=AUDIENCE,
    )


def far_past_exp_in_content() -> str:
    """The agent's closed mandate content carrying ``exp: -10**20``."""
    return present_under(
        open_mandate(PERSON, AGENT, []), AGENT, closed_payment(exp=-(10**20)), aud=AUDIENCE
    )


def far_future_exp() -> str:
    """The person's closed mandate expiring past any representable date."""
    return closed_mandate(PERSON, exp=10**20)


def huge_amount() -> str:
    return closed_mandate(PERSON, amount=10**40)


def huge_number_of_digits() -> str:
    """An amount of 5,000 digits: more than Python parses as an int by default."""
    jwt = closed_mandate(PERSON).split("~", 1)[0]
    header = jwt.split(".")[0]
    payload = person_claims(closed_payment())
    text = json.dumps(payload).replace('"amount": 2500', '"amount": ' + "9" * 5000)
    return f"{header}.{_segment(text)}.{jwt.split('.')[2]}~"


def truncated_base64() -> str:
    token = closed_mandate(PERSON)
    jwt, rest = token.split("~", 1)
    header, payload, signature = jwt.split(".")
    return f"{header}.{payload[:-3]}.{signature}~{rest}"


def truncated_disclosure() -> str:
    jwt, first, _ = closed_mandate(PERSON).split("~")
    return f"{jwt}~{first[:-1]}~"


def _signed_closed(content: dict[str, Any], disclose: tuple[str, ...] = ()) -> str:
    jwt, disclosures = PERSON.sd_jwt(person_claims(content), disclose=disclose)
    return compact(jwt, disclosures)


def lone_surrogate_subject() -> str:
    return _signed_closed({**closed_payment(), "sub": "\ud800"})


def nul_in_subject() -> str:
    return _signed_closed({**closed_payment(), "sub": "al\u0000ice"})


def lone_surrogate_disclosure() -> str:
    token = closed_mandate(PERSON)
    return token + _segment('["s","note","\\udfff"]') + "~"


def nan_exp() -> str:
    jwt = closed_mandate(PERSON).split("~", 1)[0]
    header, _p, signature = jwt.split(".")
    payload = _segment('{"exp": NaN, "sub": "a"}')
    return f"{header}.{payload}.{signature}~"


def float_exp() -> str:
    return closed_mandate(PERSON, exp=1e308)


def unicode_vct() -> str:
    return _signed_closed({**closed_payment(), "vct": "mandate.payment.\u0661"})


def deep_claims() -> str:
    nested: Any = 1
    for _ in range(200):
        nested = {"n": nested}
    return _signed_closed({**closed_payment(), "deep": nested})


def many_disclosures() -> str:
    token = closed_mandate(PERSON)
    extra = "".join(disclosure("n", i) + "~" for i in range(300))
    return token + extra


PRESENTATIONS: list[tuple[str, Callable[[], str]]] = [
    ("deep JWS header", deep_header),
    ("deep disclosure", deep_disclosure),
    ("closed execution_date in the year 1", old_execution_date),
    ("exp -10**20 in the mandate content", far_past_exp_in_content),
    ("exp 10**20", far_future_exp),
    ("amount 10**40", huge_amount),
    ("amount of 5,000 digits", huge_number_of_digits),
    ("truncated base64 payload", truncated_base64),
    ("truncated disclosure", truncated_disclosure),
    ("lone surrogate in sub", lone_surrogate_subject),
    ("NUL in sub", nul_in_subject),
    ("lone surrogate in a disclosure", lone_surrogate_disclosure),
    ("NaN exp", nan_exp),
    ("float exp", float_exp),
    ("Arabic digit in vct", unicode_vct),
    ("claims nested 200 deep", deep_claims),
    ("300 disclosures", many_disclosures),
]


async def _audited(database_url: str, code: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        async with asyncio.timeout(10):
            while True:
                count = await conn.fetchval(
                    "SELECT count(*) FROM audit_log WHERE record::jsonb->>'rule' = 'mandate' "
                    "AND record::jsonb->>'reason' = $1",
                    code,
                )
                if count:
                    return int(count)
                await asyncio.sleep(0.02)  # polled: the audit writer stores records in batches
    finally:
        await conn.close()


async def _operations(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM operations"))
    finally:
        await conn.close()


@pytest.mark.parametrize(("scenario", "presentation"), PRESENTATIONS)
async def test_a_hostile_presentation_is_a_4xx_problem_audited(
    gate: Opgate, database_url: str, scenario: str, presentation: Callable[[], str]
) -> None:
    """Each hostile presentation is answered 4xx application/problem+json with a stable code,
    leaves an audit record with that code, and creates no operation."""
    status, answer = await present(gate, gate.http, presentation())
    assert 400 <= status < 500, (scenario, status, answer)
    assert answer["code"].startswith("mandate_"), answer
    assert await _audited(database_url, answer["code"]) >= 1
    assert await _operations(database_url) == 0


async def test_a_hostile_checkout_mandate_is_a_4xx_problem(gate: Opgate, database_url: str) -> None:
    """A checkout mandate whose header is nested past any sane depth is a 4xx with a code."""
    status, answer = await present(
        gate, gate.http, closed_mandate(PERSON), checkout_mandate=deep_header()
    )
    assert (status, answer["code"]) == (403, "mandate_invalid"), answer
    assert await _operations(database_url) == 0


def _receipt_like(header: str, payload: str) -> str:
    return f"{_segment(header)}.{_segment(payload)}.{b64url(b'x' * 64)}"


@pytest.mark.parametrize(
    ("scenario", "receipt"),
    [
        ("deep header", _receipt_like("[" * DEEP + "]" * DEEP, "{}")),
        ("deep payload", _receipt_like('{"alg":"ES256"}', "[" * DEEP + "]" * DEEP)),
        ("truncated", "eyJhbGciOiJFUzI1NiJ9.e30.AAA"),
        ("lone surrogate", _receipt_like('{"alg":"ES256","kid":"\\ud800"}', "{}")),
        ("not base64", "@@@.@@@.@@@"),
    ],
)
async def test_a_hostile_receipt_presented_back_is_a_4xx_problem(
    gate: Opgate, database_url: str, scenario: str, receipt: str
) -> None:
    """A receipt presented back that is nested past any depth, truncated or not base64 is
    mandate_receipt_invalid (403), audited."""
    async with gate.http.post(
        f"{gate.agent_url}/_opgate/v1/mandates/receipts",
        json={"receipt": receipt},
        headers={"Authorization": f"Bearer {AGENT_TOKEN}"},
    ) as response:
        status, answer = response.status, json.loads(await response.read())
        assert response.content_type == "application/problem+json"
    assert (status, answer["code"]) == (403, "mandate_receipt_invalid"), (scenario, answer)
    assert await _audited(database_url, "mandate_receipt_invalid") >= 1


def test_the_deep_header_is_about_13_kb() -> None:
    """The nested header is the size the attack used (about 13 KB of base64url)."""
    assert 12_000 < len(deep_header().split(".")[0]) < 20_000


def _decide_purely(presentation: str) -> None:
    """Verify and read a presentation as the API does, without the store: it may refuse
    (SdJwtInvalid or a MandateRefusal), never raise anything else."""
    expect = Expectation(AUDIENCE, int(time.time()))
    try:
        verified = verify_presentation(presentation, TRUSTED, expect)
    except SdJwtInvalid:
        return
    terms_of(verified, datetime.now(UTC).date())
    checkout_of(verified)


TRUSTED = {PERSON.kid: TrustedKey("surface", PERSON.public_jwk)}
VALID = present_under(
    open_mandate(PERSON, AGENT, [{"type": "payment.amount_range", "currency": "USD", "max": 9}]),
    AGENT,
    closed_payment(amount=5),
    aud=AUDIENCE,
)


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, len(VALID) - 1),
    st.integers(1, 40),
    st.text(alphabet=st.characters(codec="ascii"), max_size=40),
)
def test_no_edit_of_a_presentation_raises_anything_but_a_refusal(
    at: int, length: int, inserted: str
) -> None:
    """Any span of a valid presentation replaced by any ASCII text is verified to a decision
    or refused; nothing else is raised (what would be a 500 at the API)."""
    _decide_purely(VALID[:at] + inserted + VALID[at + length :])


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=30,
    )
)
def test_any_json_as_a_disclosed_claim_is_decided_or_refused(value: Any) -> None:
    """Whatever JSON a person's mandate discloses as its constraints, payee or amount, the
    verifier decides or refuses; it never raises anything else."""
    for name in ("constraints", "payee", "payment_amount", "execution_date", "exp"):
        content = {**closed_payment(), name: value}
        jwt, disclosures = PERSON.sd_jwt(person_claims(content), disclose=(name,))
        _decide_purely(compact(jwt, disclosures))
