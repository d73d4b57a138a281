"""What of a provider's answer headers reaches the agent: the provider's allowlist (documented
defaults, plus what its policy adds), never ``Set-Cookie`` or ``WWW-Authenticate`` unless the
policy keeps them, and never a header that carries the injected credential (counted: the audit
record and a metric), whatever the policy lists."""

from __future__ import annotations

import base64
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from structlog.testing import capture_logs

from proxy.gate.headers import credential_forms, response_headers
from proxy.policy.load import parse_policy_text
from proxy.policy.model import DEFAULT_RESPONSE_HEADERS
from tests.support.audit_logs import audits
from tests.support.opgate import PROVIDER_SECRET, StartOpgate, fault_policy
from tests.support.paths import REPO

GOOD_FORM = "amount=500&currency=usd&charge=ch_1"


@dataclass
class EchoingProvider:
    """A provider that answers every call with a cookie, a challenge, its own request id and
    the credential it received, echoed as is and base64-encoded."""

    url: str = ""
    received: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        authorization = request.headers.get("Authorization", "")
        self.received.append(f"{request.method} {request.path}")
        headers = CIMultiDict(
            {
                "Request-Id": "req_123",
                "X-Custom": "kept only if listed",
                "Set-Cookie": "session=abc; HttpOnly",
                "WWW-Authenticate": 'Bearer realm="provider"',
                "X-Debug-Authorization": authorization,
                "X-Echo": base64.b64encode(authorization.partition(" ")[2].encode()).decode(),
                "X-Operation-Status": "confirmed",  # opgate's to set, never the provider's
            }
        )
        return web.json_response({"id": "re_1", "object": "refund"}, headers=headers)


@pytest_asyncio.fixture(loop_scope="session")
async def echoing() -> AsyncIterator[EchoingProvider]:
    provider = EchoingProvider()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", provider.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    provider.url = f"http://127.0.0.1:{port}"
    try:
        yield provider
    finally:
        await runner.cleanup()


def _metric(text: str, name: str, labels: str) -> float | None:
    match = re.search("^" + re.escape(f"{name}{{{labels}}}") + r" (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


async def test_the_agent_sees_only_allowed_headers_and_never_the_credential(
    start_opgate: StartOpgate, policy_dir: Path, echoing: EchoingProvider
) -> None:
    """A read and an operation: Request-Id and Content-Type reach the agent; the cookie, the
    challenge, an unlisted header and both echoes of the provider secret do not; the records
    name the two echoes and the metric counts them."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(upstream_overrides={"fault": echoing.url}) as gate:
        op = await gate.approve()
        with capture_logs() as logs:
            read = await gate.send("/fault/v1/refunds", method="GET", data=None)
            sent = await gate.send(
                "/fault/v1/refunds",
                data=GOOD_FORM,
                headers={"X-Operation-Id": op["operation_id"]},
            )
        async with gate.http.get(f"{gate.ops_url}/metrics") as response:
            metrics = await response.text()
    assert len(echoing.received) == 2
    for status, headers, _ in (read, sent):
        assert status == 200
        assert headers["Request-Id"] == "req_123"
        assert headers["Content-Type"].startswith("application/json")
        shown = {name.lower() for name in headers}
        assert not shown & {"set-cookie", "www-authenticate", "x-custom", "x-debug-authorization"}
        assert "x-echo" not in shown
        assert not any(PROVIDER_SECRET in value for value in headers.values())
    assert sent[1]["X-Operation-Status"] == "confirmed"  # opgate's own, for the operation
    assert "X-Operation-Status" not in read[1]  # the provider's is not passed on
    records = audits(logs)
    assert [r["credential_echoes"] for r in records] == [["X-Debug-Authorization", "X-Echo"]] * 2
    assert _metric(metrics, "opgate_credential_echoes_total", 'provider="fault"') == 4


async def test_a_policy_keeps_what_it_lists_but_never_the_credential(
    start_opgate: StartOpgate, policy_dir: Path, echoing: EchoingProvider
) -> None:
    """``response_headers`` adds Set-Cookie and X-Custom to the defaults; listing the echoing
    header does not let the credential through."""
    policy = fault_policy(deduplicates=False).replace(
        "rules:\n",
        "response_headers: [Set-Cookie, X-Custom, X-Debug-*]\nrules:\n",
        1,
    )
    (policy_dir / "fault.yaml").write_text(policy)
    async with start_opgate(upstream_overrides={"fault": echoing.url}) as gate:
        status, headers, _ = await gate.send("/fault/v1/refunds", method="GET", data=None)
    assert status == 200
    assert (headers["Set-Cookie"], headers["X-Custom"]) == (
        "session=abc; HttpOnly",
        "kept only if listed",
    )
    assert "X-Debug-Authorization" not in headers
    assert "WWW-Authenticate" not in headers


def test_credential_forms_cover_the_value_the_secret_and_base64() -> None:
    """A bearer value: itself, the bare secret, and its base64 spellings; a Basic value also
    its decoded user:password and password; nothing shorter than 8 characters."""
    forms = credential_forms("Bearer sk_test_0123456789")
    assert {"Bearer sk_test_0123456789", "sk_test_0123456789"} <= forms
    assert base64.b64encode(b"sk_test_0123456789").decode() in forms
    assert base64.urlsafe_b64encode(b"sk_test_0123456789").decode().rstrip("=") in forms
    basic = "Basic " + base64.b64encode(b"client:secret-value-1").decode()
    assert {"client:secret-value-1", "secret-value-1"} <= credential_forms(basic)
    short = credential_forms("Bearer short")
    assert "Bearer short" in short
    assert not {"short", "c2hvcnQ=", "c2hvcnQ"} & short


@settings(max_examples=300, deadline=None)
@given(
    secret=st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=8),
    names=st.lists(st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,12}", fullmatch=True), max_size=6),
    wrap=st.sampled_from(["{}", "x{}y", "Bearer {}", "{0}{0}"]),
)
def test_no_header_that_carries_the_secret_is_passed_on(
    secret: str, names: list[str], wrap: str
) -> None:
    """Whatever the names (all allowed) and however the secret is embedded, no header handed
    on holds it, and every header that did is named as an echo."""
    upstream: CIMultiDict[str] = CIMultiDict()
    for name in names:
        upstream.add(name, wrap.format(secret))
    upstream.add("Content-Type", "application/json")
    shown = response_headers(
        CIMultiDictProxy(upstream), [*names, "Content-Type"], credential_forms(f"Bearer {secret}")
    )
    assert not any(secret in value for value in shown.headers.values())
    assert len(shown.credential_echoes) == len(names)
    assert shown.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    "listed", ["Content-Length", "Transfer-Encoding", "X-Operation-Id", "*", "Bad Name", "A*b"]
)
def test_a_policy_cannot_list_framing_opgates_own_or_everything(listed: str) -> None:
    """Framing and hop-by-hop headers, opgate's own, a bare ``*`` and names that are not
    tokens are refused when the policy loads."""
    policy = fault_policy(deduplicates=False).replace(
        "rules:\n", f"response_headers: ['{listed}']\nrules:\n", 1
    )
    provider, problems = parse_policy_text(policy, "fault.yaml")
    assert provider is None, listed
    assert any("response_headers" in p.message for p in problems)


def test_the_policy_reference_lists_the_default_response_headers() -> None:
    """docs/reference/policy-format.md names exactly the defaults the gate applies."""
    text = (REPO / "docs" / "reference" / "policy-format.md").read_text()
    section = text.split("## What of the provider's answer reaches the agent", 1)[1]
    listed = section.split("\n\n")[2]  # the paragraph after the introduction
    assert re.findall(r"`([^`]+)`", listed) == sorted(DEFAULT_RESPONSE_HEADERS, key=str.lower)
