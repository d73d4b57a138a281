"""Who is calling: agent tokens (proxy/gate/identity.py)."""

from __future__ import annotations

import base64

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.gate.checks import Agent
from proxy.gate.identity import (
    TOKEN_PREFIX,
    AgentDirectory,
    AmbiguousCredentials,
    credential_from,
    new_token,
    presented_agent_token,
    token_digest,
)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


CREDENTIALS: list[tuple[str, str, str | None]] = [
    ("bearer", "Bearer opg_abc", "opg_abc"),
    ("bearer any case, extra spaces", "  bEaReR   opg_abc  ", "opg_abc"),
    ("basic user:token", basic("agent", "opg_abc"), "opg_abc"),
    ("basic token with a colon", basic("agent", "a:b"), "a:b"),
    ("basic empty user", basic("", "opg_abc"), "opg_abc"),
    ("basic any case", "basic " + base64.b64encode(b"u:t").decode(), "t"),
    ("basic without password", basic("agent", ""), None),
    ("basic without colon", "Basic " + base64.b64encode(b"opg_abc").decode(), None),
    ("basic not base64", "Basic !!!", None),
    ("basic not UTF-8", "Basic " + base64.b64encode(b"u:\xff").decode(), None),
    ("bearer without token", "Bearer", None),
    ("bearer with only spaces", "Bearer    ", None),
    ("other scheme", "Token opg_abc", None),
    ("bare token", "opg_abc", None),
    ("empty", "", None),
]


@pytest.mark.parametrize(
    ("value", "expected"), [pytest.param(*case[1:], id=case[0]) for case in CREDENTIALS]
)
def test_credential_from(value: str, expected: str | None) -> None:
    """The secret is read from Bearer TOKEN or Basic user:TOKEN, and from nothing else."""
    assert credential_from(value) == expected


PRESENTED: list[tuple[str, tuple[tuple[str, str], ...], str | None]] = [
    ("proxy-authorization bearer", (("Proxy-Authorization", "Bearer t1"),), "t1"),
    ("proxy-authorization basic", (("Proxy-Authorization", basic("agent", "t1")),), "t1"),
    ("provider auth header", (("Authorization", "Bearer t1"),), "t1"),
    ("header names are case-insensitive", (("authorization", "Bearer t1"),), "t1"),
    (
        "the same token in both",
        (("Proxy-Authorization", basic("a", "t1")), ("Authorization", "Bearer t1")),
        "t1",
    ),
    (
        "an unreadable value is ignored",
        (("Proxy-Authorization", "Digest x"), ("Authorization", "Bearer t1")),
        "t1",
    ),
    ("nothing", (), None),
    ("unrelated header", (("X-Api-Key", "t1"),), None),
]


@pytest.mark.parametrize(
    ("pairs", "expected"), [pytest.param(*case[1:], id=case[0]) for case in PRESENTED]
)
def test_presented_agent_token(pairs: tuple[tuple[str, str], ...], expected: str | None) -> None:
    """The agent token comes from Proxy-Authorization or the provider's auth header."""
    assert presented_agent_token(headers(*pairs), "Authorization") == expected


def test_provider_auth_header_is_ignored_when_the_provider_has_none() -> None:
    """Without a provider credential header, only Proxy-Authorization is read."""
    assert presented_agent_token(headers(("Authorization", "Bearer t1")), None) is None


AMBIGUOUS: list[tuple[str, tuple[tuple[str, str], ...]]] = [
    (
        "two differing credentials",
        (("Proxy-Authorization", "Bearer t1"), ("Authorization", "Bearer t2")),
    ),
    (
        "basic and bearer disagree",
        (("Proxy-Authorization", basic("agent", "t1")), ("Authorization", "Bearer t2")),
    ),
    (
        "duplicated Proxy-Authorization",
        (("Proxy-Authorization", "Bearer t1"), ("Proxy-Authorization", "Bearer t1")),
    ),
    (
        "duplicated provider auth header",
        (("Authorization", "Bearer t1"), ("authorization", "Bearer t1")),
    ),
]


@pytest.mark.parametrize("pairs", [pytest.param(case[1], id=case[0]) for case in AMBIGUOUS])
def test_ambiguous_credentials(pairs: tuple[tuple[str, str], ...]) -> None:
    """Two credentials that differ, or one header sent twice, are refused as ambiguous."""
    with pytest.raises(AmbiguousCredentials):
        presented_agent_token(headers(*pairs), "Authorization")


def test_agent_directory_looks_up_by_digest() -> None:
    """Agents are found by the SHA-256 of their token; the clear token is never stored."""
    token = new_token()
    agent = Agent("agent-1", "acme")
    directory = AgentDirectory({token_digest(token): agent})
    assert token.startswith(TOKEN_PREFIX)
    assert token not in directory.by_digest
    assert directory.lookup(token) == agent
    assert directory.lookup(token + "x") is None
    assert new_token() != token


def test_token_digest_is_sha256_hex() -> None:
    """A token digest is the hex SHA-256 of its UTF-8 bytes."""
    assert token_digest("abc") == (
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("Bearer opg_\udcff", id="undecodable byte in a bearer token"),
        pytest.param("Bearer opg_\u00e9", id="non-ASCII bearer token"),
        pytest.param("Basic " + base64.b64encode("u:t\u00e9".encode()).decode(), id="basic"),
        pytest.param("Bearer opg_a\x00b", id="NUL"),
    ],
)
def test_credentials_are_printable_ascii(value: str) -> None:
    """A credential that is not printable ASCII is no credential (never hashed, never matched):
    tokens opgate issues are ASCII, and hashing an undecodable one would fail."""
    assert credential_from(value) is None
    assert presented_agent_token(headers(("Authorization", value)), "Authorization") is None


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        ((("X-API-Key", "opg_agent"),), "opg_agent"),
        ((("X-API-Key", "opg_agent"), ("Proxy-Authorization", "Bearer opg_agent")), "opg_agent"),
        ((("X-API-Key", "Bearer opg_agent"),), "Bearer opg_agent"),
        ((("X-API-Key", " "),), None),
    ],
)
def test_an_api_key_header_carries_the_token_bare(
    pairs: tuple[tuple[str, str], ...], expected: str | None
) -> None:
    """Where the provider's credential is an API-key header (no scheme), as an SDK's api key
    sends it, the header's whole value is the agent's token."""
    assert presented_agent_token(headers(*pairs), "X-API-Key", raw=True) == expected


def test_two_different_tokens_through_an_api_key_header_are_ambiguous() -> None:
    """A bare API-key token and a different proxy token are refused, as with Authorization."""
    pairs = (("X-API-Key", "opg_a"), ("Proxy-Authorization", "Bearer opg_b"))
    with pytest.raises(AmbiguousCredentials):
        presented_agent_token(headers(*pairs), "X-API-Key", raw=True)
