"""Forward mode with an API-key header (proxy/gate/forwarded.py): the header holds a token
bare, so another agent's token there is recognised and refused as ambiguous."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.gate.checks import Agent
from proxy.gate.decision import Deny
from proxy.gate.forwarded import ForwardedRequest, Origin, forwarded_agent
from proxy.gate.identity import AgentDirectory, token_digest
from proxy.gate.reasons import Reason

MINE, OTHER = Agent("a", "t1"), Agent("b", "t1")
AGENTS = AgentDirectory({token_digest("opg_mine"): MINE, token_digest("opg_other"): OTHER})


def request(api_key: str) -> tuple[ForwardedRequest, CIMultiDictProxy[str]]:
    forwarded = ForwardedRequest(
        MINE, Origin("https", "checkout-test.adyen.com", 443), "adyen", "/v71", "/v71/payments"
    )
    return forwarded, CIMultiDictProxy(CIMultiDict({"X-API-Key": api_key}))


def test_another_agents_bare_token_in_the_api_key_header_is_ambiguous() -> None:
    """X-API-Key holding another agent's token, bare, is refused ambiguous_request."""
    forwarded, headers = request("opg_other")
    decision = forwarded_agent(AGENTS, forwarded, headers, "X-API-Key", raw=True)
    assert isinstance(decision, Deny)
    assert decision.reason is Reason.AMBIGUOUS_REQUEST


def test_the_agents_own_token_or_a_placeholder_key_passes() -> None:
    """The proxy credential's own token, or any key that is no agent's, is replaced by opgate."""
    for value in ("opg_mine", "placeholder"):
        forwarded, headers = request(value)
        assert forwarded_agent(AGENTS, forwarded, headers, "X-API-Key", raw=True) == MINE
