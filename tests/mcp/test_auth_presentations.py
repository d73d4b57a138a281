"""Hiding never widens, for the MCP endpoint's access tokens: hypothesis makes presentations of
one valid token from a real authorization server that withhold claims, reorder them, give a
claim twice, give the audience as an array with extras, or cut the token; each is refused, or
decides exactly what the full token decides (the same agent, the same scopes).

The tokens are minted by the test's authorization server (tests/support/oauth_server.py) and
checked by opgate's verifier (proxy/mcp/auth.py): minting and checking share no code."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.gate.checks import Agent
from proxy.mcp.auth import Bearer, OAuthVerifier, TokenRefused
from proxy.settings import McpOAuth
from tests.support.oauth_server import AuthorizationServer, authorization_server

RESOURCE = "https://opgate.example/_opgate/mcp"
ELSEWHERE = "https://elsewhere.example/_opgate/mcp"
SCOPE = "operations:read proposals:write"
WIDER_SCOPE = "operations:read operations:execute proposals:write"
AGENTS = {"agent-a": Agent("agent-a", "t1"), "agent-b": Agent("agent-b", "t2")}
# every claim the authorization server puts in a token (tests/support/oauth_server.py)
CLAIMS = ("iss", "sub", "aud", "scope", "iat", "exp", "client_id")


@dataclass(repr=False)
class Verifying:
    server: AuthorizationServer
    verifier: OAuthVerifier
    http: aiohttp.ClientSession
    claims: dict[str, Any]  # of the valid token every presentation is made from

    def __repr__(self) -> str:
        return f"Verifying({self.server.issuer})"

    async def decide(self, token: str) -> Bearer | TokenRefused:
        return await self.verifier.verify(self.http, token)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def verifying() -> AsyncIterator[Verifying]:
    async with (
        authorization_server("ES256") as server,
        aiohttp.ClientSession(trust_env=False) as http,
    ):
        oauth = McpOAuth.model_validate(
            {
                "resource": RESOURCE,
                "issuers": [
                    {
                        "issuer": server.issuer,
                        "jwks_uri": f"{server.url}/jwks.json",
                        "subjects": [
                            {"subject": "client-a", "agent_id": "agent-a"},
                            {"subject": "client-b", "agent_id": "agent-b"},
                        ],
                    }
                ],
            }
        )
        server.token("client-a", RESOURCE, SCOPE, expires_in=3600)
        [claims] = server.issued
        yield Verifying(server, OAuthVerifier(oauth, AGENTS), http, claims)


# another value each claim could be given twice with: one that would widen or move the token
OTHER_VALUES: dict[str, Any] = {
    "iss": "https://issuer.elsewhere.example",
    "sub": "client-b",
    "aud": ELSEWHERE,
    "scope": WIDER_SCOPE,
    "iat": 0,
    "exp": 4_102_444_800,
    "client_id": "client-b",
}


@dataclass(frozen=True)
class Presentation:
    """How one presentation differs from the full token."""

    withheld: frozenset[str]
    order: tuple[str, ...]
    audience_extras: tuple[tuple[int, str], ...] | None  # None: aud as the plain string
    twice: tuple[tuple[str, bool], ...]  # (a shown claim, whether its other value is last)
    cut: float | None  # the token cut at this fraction of its length

    def token(self, server: AuthorizationServer, claims: dict[str, Any]) -> str:
        members: list[tuple[str, Any]] = []
        for name in self.order:
            if name in self.withheld:
                continue
            value = claims[name]
            if name == "aud" and self.audience_extras is not None:
                value = [value]
                for index, extra in self.audience_extras:
                    value.insert(index % (len(value) + 1), extra)
            members.append((name, value))
        for name, last in self.twice:
            if name in self.withheld:  # a claim given instead of withheld is another token
                continue
            other = (name, OTHER_VALUES[name])
            members = [*members, other] if last else [other, *members]
        payload = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}"
        token = server.signed(payload.encode())
        if self.cut is not None:
            token = token[: int(len(token) * self.cut)]
        return token


presentations = st.builds(
    Presentation,
    withheld=st.frozensets(st.sampled_from(CLAIMS)),
    order=st.permutations(CLAIMS).map(tuple),
    audience_extras=st.none()
    | st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([RESOURCE, ELSEWHERE, "opgate"])),
        max_size=3,
    ).map(tuple),
    twice=st.lists(st.tuples(st.sampled_from(CLAIMS), st.booleans()), max_size=2).map(tuple),
    cut=st.none() | st.floats(0.0, 0.999),
)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(presentation=presentations)
async def test_hiding_never_widens_an_access_token(
    verifying: Verifying, presentation: Presentation
) -> None:
    """Each presentation is refused, or decides exactly what the full token decides."""
    claims = verifying.claims
    full = await verifying.decide(verifying.server.signed(json.dumps(claims).encode()))
    assert full == Bearer(AGENTS["agent-a"], frozenset(SCOPE.split()))
    decided = await verifying.decide(presentation.token(verifying.server, claims))
    assert isinstance(decided, TokenRefused) or decided == full, (presentation, decided)


def _members(claims: dict[str, Any], *more: tuple[str, Any], drop: str = "") -> bytes:
    """A claims object, the members in this order, ``more`` appended, ``drop`` left out."""
    members = [(k, v) for k, v in claims.items() if k != drop] + list(more)
    return ("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}").encode()


@pytest.mark.parametrize(
    ("scenario", "header"),
    [
        pytest.param(lambda c: _members(c, drop="scope"), {}, id="scope withheld"),
        pytest.param(lambda c: _members(c, ("scope", WIDER_SCOPE)), {}, id="scope twice"),
        pytest.param(lambda c: _members(c, ("sub", "client-b")), {}, id="subject twice"),
        pytest.param(lambda c: _members(c, ("exp", str(c["exp"])), drop="exp"), {}, id="exp text"),
        pytest.param(lambda c: _members(c), {"crit": ["exp"], "exp": 1}, id="critical header"),
    ],
)
async def test_a_token_that_hides_repeats_or_misspells_a_claim_is_refused(
    verifying: Verifying,
    scenario: Callable[[dict[str, Any]], bytes],
    header: dict[str, Any],
) -> None:
    """A token the issuer signed without a scope, with a claim given twice, with ``exp`` as a
    string, or naming a critical header extension is refused: no reading of it is chosen."""
    token = verifying.server.signed(scenario(verifying.claims), **header)
    assert isinstance(await verifying.decide(token), TokenRefused)


async def test_an_audience_array_naming_this_endpoint_decides_as_the_string(
    verifying: Verifying,
) -> None:
    """RFC 9068 section 4: the audience must contain this endpoint; an array that does decides
    what the plain string decides (the extras neither add nor take away)."""
    claims = {**verifying.claims, "aud": [ELSEWHERE, RESOURCE]}
    decided = await verifying.decide(verifying.server.signed(json.dumps(claims).encode()))
    assert decided == Bearer(AGENTS["agent-a"], frozenset(SCOPE.split()))
