"""Which provider or pass-through host a forward-mode destination is, and Host agreement."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from proxy.forward.listener import _connect_authority
from proxy.forward.targets import (
    Inspect,
    PassThrough,
    decide_absolute,
    decide_connect,
    host_header_agrees,
    upstream_base_path,
)
from proxy.gate.decision import Deny
from proxy.gate.forwarded import Origin
from proxy.gate.reasons import Reason
from proxy.policy.model import Provider
from proxy.policy.set import PolicySet


def provider(name: str, upstream: str, extra: str = "") -> Provider:
    text = (
        textwrap.dedent(f"""\
        version: 1
        provider: {name}
        route_prefix: /{name}
        upstream: {upstream}
        rules:
          - {{name: read, method: GET, path: "/v1/{{rest...}}", operation: none, body: none}}
        """)
        + extra
    )
    return Provider.model_validate(yaml.safe_load(text))


POLICY = PolicySet(
    (
        provider(
            "stripe",
            "https://api.stripe.com",
            "forward_proxy:\n  pass_through: [{host: files.stripe.com}, {host: api.stripe.com}]\n",
        ),
        provider("plain", "http://plain.example:8080/base"),
    ),
    version="test",
)


def test_a_providers_https_host_is_inspected() -> None:
    """CONNECT to the provider's upstream host and port is inspected, even though a policy
    also lists it as pass-through: never an opaque tunnel to an inspected host."""
    decided = decide_connect(POLICY, {}, "API.Stripe.com", 443)
    assert isinstance(decided, Inspect)
    assert decided.provider.provider == "stripe"


def test_pass_through_hosts_are_tunnelled_and_everything_else_refused() -> None:
    """A listed companion host is a pass-through; another port, another host, or a plain-HTTP
    provider's host are refused."""
    assert isinstance(decide_connect(POLICY, {}, "files.stripe.com", 443), PassThrough)
    for host, port in [("files.stripe.com", 8443), ("evil.example", 443), ("plain.example", 8080)]:
        decided = decide_connect(POLICY, {}, host, port)
        assert isinstance(decided, Deny)
        assert decided.reason is Reason.HOST_NOT_ALLOWED


def test_an_override_replaces_the_policy_upstream() -> None:
    """With an upstream override, the provider answers at the override's origin only: the
    production host is then unlisted, so a staging credential never reaches it."""
    overrides = {"stripe": "https://stripe.test:8443"}
    assert isinstance(decide_connect(POLICY, overrides, "stripe.test", 8443), Inspect)
    assert isinstance(decide_connect(POLICY, overrides, "api.stripe.com", 443), PassThrough)


def test_absolute_form_matches_scheme_host_and_port() -> None:
    """Plain-HTTP requests reach a provider only at its exact origin; its base path is kept."""
    origin = Origin.of("http://plain.example:8080/base/v1/x")
    assert origin == Origin("http", "plain.example", 8080)
    assert isinstance(decide_absolute(POLICY, {}, origin), Inspect)
    assert isinstance(decide_absolute(POLICY, {}, Origin("http", "plain.example", 80)), Deny)
    assert isinstance(decide_absolute(POLICY, {}, Origin("https", "plain.example", 8080)), Deny)
    assert upstream_base_path(POLICY.providers[1], {}) == "/base"


def test_urls_with_credentials_or_other_schemes_are_not_origins() -> None:
    """userinfo and non-HTTP schemes are refused rather than interpreted."""
    assert Origin.of("http://user:pw@plain.example/") is None
    assert Origin.of("ftp://plain.example/") is None


HOST_CASES = [
    ("implicit default port", "api.stripe.com", Origin("https", "api.stripe.com", 443), True),
    ("explicit port", "api.stripe.com:443", Origin("https", "api.stripe.com", 443), True),
    ("case", "API.Stripe.com", Origin("https", "api.stripe.com", 443), True),
    ("other host", "evil.example", Origin("https", "api.stripe.com", 443), False),
    ("other port", "api.stripe.com:8443", Origin("https", "api.stripe.com", 443), False),
    ("ipv6", "[::1]:8443", Origin("https", "::1", 8443), True),
    ("garbage port", "api.stripe.com:x", Origin("https", "api.stripe.com", 443), False),
]


@pytest.mark.parametrize(
    ("scenario", "header", "origin", "agrees"), HOST_CASES, ids=[c[0] for c in HOST_CASES]
)
def test_host_header_agreement(scenario: str, header: str, origin: Origin, agrees: bool) -> None:
    """A Host header agrees only when it names exactly the addressed host and port."""
    assert host_header_agrees(header, origin) is agrees


AUTHORITY_CASES = [
    ("name", "api.stripe.com:443", ("api.stripe.com", 443)),
    ("ipv6", "[::1]:8443", ("::1", 8443)),
    ("no port", "api.stripe.com", None),
    ("port zero", "api.stripe.com:0", None),
    ("userinfo", "a@api.stripe.com:443", None),
    ("path", "api.stripe.com:443/x", None),
    ("bare ipv6", "::1:443", None),
]


@pytest.mark.parametrize(
    ("scenario", "raw", "expected"), AUTHORITY_CASES, ids=[c[0] for c in AUTHORITY_CASES]
)
def test_connect_target_parsing(scenario: str, raw: str, expected: tuple[str, int] | None) -> None:
    """A CONNECT target is host:port exactly; anything else is refused."""
    assert _connect_authority(raw) == expected
