"""Which headers cross opgate, in each direction (proxy/gate/headers.py)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.gate.headers import (
    duplicated_header,
    outbound_headers,
    response_headers,
    unreadable_header,
)

ALLOWED = ["Accept", "User-Agent", "Stripe-Version", "Keep-Alive", "Proxy-Authorization", "TE"]


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_only_allowed_headers_are_forwarded() -> None:
    """Headers outside the provider's allowlist (e.g. Stripe-Account, Cookie) are dropped."""
    out = outbound_headers(
        headers(
            ("Accept", "application/json"),
            ("stripe-version", "2024-06-20"),
            ("Stripe-Account", "acct_other"),
            ("Cookie", "a=b"),
            ("X-Operation-Id", "op_1"),
        ),
        ALLOWED,
        {},
    )
    assert list(out.items()) == [("Accept", "application/json"), ("stripe-version", "2024-06-20")]


def test_hop_by_hop_headers_are_dropped_even_if_allowed() -> None:
    """Hop-by-hop headers never cross, even when a policy lists them."""
    out = outbound_headers(
        headers(
            ("Keep-Alive", "timeout=5"),
            ("TE", "trailers"),
            ("Connection", "keep-alive"),
            ("Transfer-Encoding", "chunked"),
            ("Accept", "*/*"),
        ),
        [*ALLOWED, "Connection", "Transfer-Encoding"],
        {},
    )
    assert list(out.items()) == [("Accept", "*/*")]


def test_proxy_authorization_is_never_forwarded() -> None:
    """The agent's Proxy-Authorization is never sent on, whatever the allowlist says."""
    out = outbound_headers(
        headers(("Proxy-Authorization", "Bearer opg_secret"), ("proxy-authorization", "x")),
        ALLOWED,
        {},
    )
    assert "Proxy-Authorization" not in out


def test_headers_named_in_connection_are_dropped() -> None:
    """A header the agent names in Connection is hop-by-hop and dropped, though allowlisted."""
    out = outbound_headers(
        headers(
            ("Connection", "close, User-Agent"),
            ("Connection", " Stripe-Version "),
            ("User-Agent", "agent/1"),
            ("Stripe-Version", "2024-06-20"),
            ("Accept", "*/*"),
        ),
        ALLOWED,
        {},
    )
    assert list(out.items()) == [("Accept", "*/*")]


def test_injections_override_agent_values_case_insensitively() -> None:
    """opgate's injected headers replace the agent's, whatever case either is spelled in."""
    out = outbound_headers(
        headers(
            ("authorization", "Bearer opg_agent"),
            ("IDEMPOTENCY-KEY", "agent-key"),
            ("idempotency-key", "agent-key-2"),
            ("Accept", "*/*"),
        ),
        [*ALLOWED, "Authorization", "Idempotency-Key"],
        {"Authorization": "Bearer sk_live", "Idempotency-Key": "opk_1"},
    )
    assert out.getall("Authorization") == ["Bearer sk_live"]
    assert out.getall("idempotency-key") == ["opk_1"]
    assert out["Accept"] == "*/*"
    assert len(out) == 3


def test_injections_are_added_even_if_not_allowlisted() -> None:
    """Injected headers are set regardless of the allowlist; it only filters the agent's."""
    out = outbound_headers(headers(), [], {"Idempotency-Key": "opk_1"})
    assert list(out.items()) == [("Idempotency-Key", "opk_1")]


def test_repeated_allowed_headers_keep_every_value() -> None:
    """An allowed header sent twice is forwarded twice, in order."""
    out = outbound_headers(headers(("Accept", "a"), ("accept", "b")), ALLOWED, {})
    assert out.getall("Accept") == ["a", "b"]


def test_response_headers_drop_framing_and_hop_by_hop() -> None:
    """The provider's hop-by-hop, Connection-named and Content-Length headers don't reach agents,
    even where a policy lists them all (`*`-prefixes); repeated allowed ones keep every value."""
    shown = response_headers(
        headers(
            ("Content-Type", "application/json"),
            ("Content-Length", "12"),
            ("Transfer-Encoding", "chunked"),
            ("Connection", "close, X-Internal"),
            ("X-Internal", "1"),
            ("Request-Id", "req_1"),
            ("Set-Cookie", "a=1"),
            ("Set-Cookie", "b=2"),
        ),
        ["C*", "T*", "X-*", "Request-Id", "Set-Cookie"],
        frozenset(),
    )
    assert list(shown.headers.items()) == [
        ("Content-Type", "application/json"),
        ("Request-Id", "req_1"),
        ("Set-Cookie", "a=1"),
        ("Set-Cookie", "b=2"),
    ]


@pytest.mark.parametrize(
    ("pairs", "extra", "expected"),
    [
        pytest.param((("X-Operation-Id", "a"), ("x-operation-id", "a")), (), "X-Operation-Id"),
        pytest.param((("Content-Type", "a"), ("Content-Type", "b")), (), "Content-Type"),
        pytest.param((("Host", "a"), ("host", "a")), (), "Host", id="Host"),
        pytest.param(
            (("Idempotency-Key", "k"), ("Idempotency-Key", "k")),
            ("Idempotency-Key",),
            "Idempotency-Key",
            id="provider idempotency header",
        ),
        pytest.param(
            (("Idempotency-Key", "k"), ("Idempotency-Key", "k")), (), None, id="not listed"
        ),
        pytest.param((("Accept", "a"), ("Accept", "b")), (), None, id="multi-valued header"),
        pytest.param((("Content-Type", "a"),), (), None, id="once"),
    ],
)
def test_duplicated_header(
    pairs: tuple[tuple[str, str], ...], extra: tuple[str, ...], expected: str | None
) -> None:
    """A single-valued header (or the provider's extra ones) sent twice is named."""
    assert duplicated_header(headers(*pairs), extra) == expected


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        pytest.param((("Accept", "*/*"), ("User-Agent", "a b\tc")), None, id="printable"),
        pytest.param((("X-Note", "caf\u00e9"),), "X-Note", id="non-ASCII"),
        pytest.param((("X-Note", "a\udcc3("),), "X-Note", id="undecodable byte"),
        pytest.param((("X-Note", "a\x00b"),), "X-Note", id="NUL"),
        pytest.param((("Accept", "*/*"), ("X-Note", "a\x1bb")), "X-Note", id="escape"),
        pytest.param((("X-Note", "a\x7f"),), "X-Note", id="DEL"),
    ],
)
def test_unreadable_header(pairs: tuple[tuple[str, str], ...], expected: str | None) -> None:
    """The first header whose value is not printable ASCII (space and tab allowed) is named."""
    assert unreadable_header(headers(*pairs)) == expected
