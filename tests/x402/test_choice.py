"""The one requirement an approval covers: none is chosen beyond the approval, whatever the
challenge withholds, reorders or repeats; the cheapest fitting one is chosen otherwise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from x402.schemas import PaymentRequired, PaymentRequirements

from proxy.x402.choice import Accepted, Approval, choose
from proxy.x402.refusal import Refused, Why
from tests.support.x402_ledger import NETWORK, TOKEN
from tests.support.x402_minting import RESOURCE, challenge, requirement
from tests.support.x402_server import PAYEE, PRICE

ACCEPTED = Accepted(frozenset({"exact"}), frozenset({NETWORK}), frozenset({TOKEN.lower()}))
APPROVAL = Approval(RESOURCE, PRICE, TOKEN, NETWORK, PAYEE)
OTHER = "0x000000000000000000000000000000000000bAd1"

# requirements that break one term each, with the words the refusal uses for it
BREAKING: dict[str, tuple[dict[str, Any], str]] = {
    "payee": ({"payTo": OTHER}, "payTo is not the approved payee"),
    "amount": ({"amount": str(PRICE + 1)}, "amount over the approved maximum"),
    "network": ({"network": "eip155:1"}, "network not approved"),
    "asset": ({"asset": "0x" + "11" * 20}, "asset not approved"),
    "scheme": ({"scheme": "upto"}, "scheme not accepted"),
    "timeout": ({"maxTimeoutSeconds": 86400}, "maxTimeoutSeconds out of range"),
    "domain": ({"extra": {}}, "no EIP-712 domain"),
    "permit2": (
        {"extra": {"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2"}},
        "only EIP-3009",
    ),
}


def chosen_from(document: dict[str, Any]) -> PaymentRequirements | Refused:
    return choose(PaymentRequired.model_validate(document), APPROVAL, ACCEPTED)


@pytest.mark.parametrize("term", BREAKING.keys())
def test_a_requirement_that_breaks_one_term_is_refused_naming_it(term: str) -> None:
    """A challenge whose only requirement breaks one term: NOT_APPROVED, naming that term."""
    changes, words = BREAKING[term]
    refused = chosen_from(challenge(requirement(**changes)))
    assert isinstance(refused, Refused)
    assert refused.why is Why.NOT_APPROVED
    assert words in refused.detail


def test_a_challenge_without_its_resource_is_not_approved() -> None:
    """The resource withheld is not the approved resource."""
    document = challenge()
    del document["resource"]
    assert isinstance(chosen_from(document), Refused)


@given(
    st.lists(st.sampled_from(sorted(BREAKING)), max_size=5),
    st.lists(st.integers(min_value=1, max_value=PRICE), min_size=1, max_size=3),
    st.randoms(use_true_random=False),
)
def test_reordered_and_repeated_requirements_choose_the_cheapest_fitting_one(
    broken: list[str], prices: list[int], random: Any
) -> None:
    """Whatever breaking requirements surround them, in any order, repeated or not, the
    cheapest approved requirement is chosen and never a breaking one."""
    accepts = [requirement(**BREAKING[term][0]) for term in broken]
    accepts += [requirement(amount=str(price)) for price in prices]
    random.shuffle(accepts)
    chosen = chosen_from(challenge(*accepts))
    assert isinstance(chosen, PaymentRequirements)
    assert int(chosen.amount) == min(prices)
    assert chosen.pay_to == PAYEE


@given(st.lists(st.sampled_from(sorted(BREAKING)), min_size=1, max_size=6))
def test_only_breaking_requirements_are_never_chosen(broken: list[str]) -> None:
    """A challenge made only of requirements that break a term is refused."""
    chosen = chosen_from(challenge(*[requirement(**BREAKING[term][0]) for term in broken]))
    assert isinstance(chosen, Refused)
