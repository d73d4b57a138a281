"""A mandate's identity (proxy/mandates/identity.py): one for a mandate and its twin, and the
digest of the other text kept for records made before."""

from __future__ import annotations

from proxy.mandates.identity import MandateIdentity, mandate_identity
from tests.support.mandate_gate import PERSON
from tests.support.mandates import closed_mandate, digest, high_s, identity, twin


def test_a_mandate_and_its_twin_have_one_identity_and_name_each_others_text() -> None:
    """Given either text of a high-S mandate, its identity is its low-S text's digest and its
    ``twin`` the high-S text's: what opgate keyed it by before."""
    token = high_s(closed_mandate(PERSON))
    jwt, other = token.split("~")[0], twin(token).split("~")[0]
    expected = MandateIdentity(digest(other), digest(jwt))
    assert mandate_identity(jwt) == mandate_identity(other) == expected
    assert expected.digest == identity(jwt)
    assert mandate_identity(closed_mandate(PERSON).split("~")[0]) != expected


def test_a_jwt_whose_signature_does_not_read_has_one_text() -> None:
    """A refused presentation's JWT (no signature, as ``alg: none`` has) is kept under the
    digest of its text, both spellings the same."""
    jwt = closed_mandate(PERSON).split("~")[0].rsplit(".", 1)[0] + "."
    assert mandate_identity(jwt) == MandateIdentity(digest(jwt), digest(jwt))
