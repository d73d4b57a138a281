"""What a bundle's records say of an operation (proxy/observe/auditlog/evidence.py), pure: sends
counted from claims and withdrawn attempts, answers checked against the settling record, and
mandates (closed, and AP2's open-then-closed chain, minted by tests/support/mandates.py)
checked against the digests an approval names and the issuer's keys."""

from __future__ import annotations

import base64
import hashlib
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from joserfc.jwk import ECKey

from proxy.observe.auditlog.chain import StoredRecord
from proxy.observe.auditlog.evidence import check_mandate, operations
from tests.support.mandates import (
    Signer,
    closed_mandate,
    closed_payment,
    digest,
    high_s,
    identity,
    open_mandate,
    present_under,
    twin,
)

OP = "op_evidence"
PERSON = Signer("surface-2026")
AGENT = Signer("agent-key")
AT = datetime(2026, 12, 3, tzinfo=UTC)


def transition(seq: int, event: str, status_after: str, **detail: Any) -> StoredRecord:
    record = {"event": event, "status_after": status_after, "actor": "gw-1", "detail": detail}
    return StoredRecord(OP, seq, AT, "transition", OP, json.dumps(record), b"", b"")


def request(seq: int, **fields: Any) -> StoredRecord:
    return StoredRecord("requests/gw-1", seq, AT, "request", OP, json.dumps(fields), b"", b"")


CREATED = transition(
    1, "created", "created", approval_ref="T-1", approved_by="admin", provider="fault"
)


def claimed(seq: int, attempt: int) -> StoredRecord:
    return transition(seq, "claimed", "dispatched", attempt=attempt)


@pytest.mark.parametrize(
    ("scenario", "records", "line"),
    [
        ("never claimed", [CREATED], "never sent (0 attempts)"),
        (
            "one attempt withdrawn, one sent",
            [
                CREATED,
                claimed(2, 1),
                transition(3, "unknown", "dispatched", attempt=1, outcome="not_sent"),
                claimed(4, 2),
            ],
            "sent once (2 attempts, 1 withdrawn before a byte left)",
        ),
        (
            "two attempts sent",
            [CREATED, claimed(2, 1), transition(3, "unknown", "dispatched"), claimed(4, 2)],
            "sent 2 times (2 attempts), each with the operation's one idempotency key",
        ),
    ],
)
def test_sends_are_counted_from_claims(
    scenario: str, records: list[StoredRecord], line: str
) -> None:
    """Each claim is an attempt; one released ``not_sent`` sent nothing."""
    [found] = operations(records, {})
    assert any(shown.startswith(line) for shown in found.lines), found.lines


def answer(body: bytes, **fields: Any) -> dict[str, Any]:
    return {
        "status": "confirmed",
        "provider_status": 200,
        "object_id": "re_1",
        "body": base64.b64encode(body).decode(),
        **fields,
    }


def test_an_answer_is_checked_against_the_settling_records() -> None:
    """The stored answer matches the settled record and the digest its request received; a
    different object is a break; an answer settled by a lookup, which no record digests, is
    unproven and not a break."""
    body = b'{"id": "re_1"}'
    settled = [
        CREATED,
        claimed(2, 1),
        transition(3, "confirmed", "confirmed", attempt=1, provider_status=200, object_id="re_1"),
        request(
            1,
            decision="allow",
            status_after="confirmed",
            provider_answer_sha256=hashlib.sha256(body).hexdigest(),
        ),
    ]
    [found] = operations(settled, {OP: answer(body)})
    assert (found.breaks, found.unproven) == ([], [])
    assert found.lines[-1].startswith("the stored answer matches the signed record")

    [found] = operations(settled, {OP: answer(body, object_id="re_2")})
    assert found.breaks == [
        f"operation {OP}: the stored answer in the bundle is not the one the signed records"
        " hold (object re_2, the record's re_1)"
    ]

    looked_up = [CREATED, claimed(2, 1), transition(3, "reconciled", "confirmed", found="re_1")]
    [found] = operations(looked_up, {OP: answer(body)})
    assert found.breaks == []
    assert "settled confirmed by a lookup at the provider (reconciled)" in found.lines
    assert found.unproven[0].startswith(f"operation {OP}: no record holds a digest")


def test_mandates_are_checked_against_the_approvals_digests_and_the_issuers_keys() -> None:
    """A closed mandate, and an agent's closed mandate under a person's open one, verify
    against their digests and the issuer's keys; another mandate, another open mandate, or
    keys without the signing one, do not."""
    closed = closed_mandate(PERSON)
    mandate = {"presentation": closed, "issuer": "surface", "issuer_jwks": PERSON.jwks}
    closed_digest = digest(closed.split("~")[0])
    thumbprint = ECKey.import_key(PERSON.public_jwk).thumbprint()  # joserfc's, RFC 7638
    assert check_mandate(mandate, closed_digest, None) == (
        None,
        f"issuer surface (key surface-2026, RFC 7638 thumbprint {thumbprint})",
    )
    other = digest(closed_mandate(PERSON).split("~")[0])
    assert check_mandate(mandate, other, None)[0] == (
        f"is not the mandate the approval names ({other})"
    )
    stranger = Signer("surface-2026")  # the same key id, another key
    problem, _ = check_mandate({**mandate, "issuer_jwks": stranger.jwks}, closed_digest, None)
    assert problem == (
        "is not signed by the issuer's keys it was accepted with: the signature does not"
        " verify with key surface-2026"
    )

    open_token = open_mandate(PERSON, AGENT, [])
    chain = present_under(open_token, AGENT, closed_payment(), aud="opgate.test")
    agents_jwt = chain.split("~~")[1].split("~")[0]
    chained = {**mandate, "presentation": chain}
    open_digest = digest(open_token.split("~")[0])
    assert check_mandate(chained, digest(agents_jwt), open_digest)[0] is None
    assert check_mandate(chained, digest(agents_jwt), other)[0] == (
        f"is not under the open mandate the approval names ({other})"
    )


def test_a_mandate_is_proven_under_either_of_its_signature_texts() -> None:
    """A presentation proves an approval whose digests are those of its own texts (a record
    made before a mandate was keyed by its low-S identity) or of its twin's (its identity
    now); the digest of another mandate, or of another open mandate, still proves nothing."""
    closed = high_s(closed_mandate(PERSON))
    jwt = closed.split("~")[0]
    for presented in (closed, twin(closed)):
        mandate = {"presentation": presented, "issuer": "surface", "issuer_jwks": PERSON.jwks}
        for named in (digest(jwt), identity(jwt)):
            assert check_mandate(mandate, named, None)[0] is None, (presented, named)
        other = identity(closed_mandate(PERSON).split("~")[0])
        assert check_mandate(mandate, other, None)[0] == (
            f"is not the mandate the approval names ({other})"
        )

    open_token = high_s(open_mandate(PERSON, AGENT, []))
    open_jwt = open_token.split("~")[0]
    for root in (open_token, twin(open_token)):
        chain = present_under(root, AGENT, closed_payment(), aud="opgate.test")
        agents_jwt = chain.split("~~")[1].split("~")[0]
        chained = {"presentation": chain, "issuer": "surface", "issuer_jwks": PERSON.jwks}
        for named_open in (digest(open_jwt), identity(open_jwt)):
            assert check_mandate(chained, identity(agents_jwt), named_open)[0] is None
        other = identity(open_mandate(PERSON, AGENT, []).split("~")[0])
        assert check_mandate(chained, identity(agents_jwt), other)[0] == (
            f"is not under the open mandate the approval names ({other})"
        )
