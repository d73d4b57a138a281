"""The PayPal SDK configured as its users configure it (client id and secret; the secret is
the agent's opgate token): its token request is answered at the boundary with the agent's own
opgate token, PayPal's token never leaves opgate, and refusals are in PayPal's shape."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from paypalserversdk.configuration import Configuration, Environment, Server
from paypalserversdk.exceptions.o_auth_provider_exception import OAuthProviderException
from paypalserversdk.http.auth.o_auth_2 import ClientCredentialsAuthCredentials
from paypalserversdk.paypal_serversdk_client import PaypalServersdkClient
from structlog.testing import capture_logs

from tests.support.audit_logs import audits
from tests.support.fake_paypal import FakePayPal
from tests.support.opgate import AGENT_TOKEN, Opgate
from tests.support.sdk_gates import approve_order, order, paypal, paypal_gate  # noqa: F401


def usual_sdk(gate: Opgate, secret: str = AGENT_TOKEN) -> PaypalServersdkClient:
    """The SDK as PayPal's docs configure it, its environment pointed at opgate."""
    config = Configuration(
        environment=Environment.SANDBOX,
        client_credentials_auth_credentials=ClientCredentialsAuthCredentials(
            o_auth_client_id="agent-a", o_auth_client_secret=secret
        ),
    )
    config.environments = {Environment.SANDBOX: {Server.DEFAULT: f"{gate.agent_url}/paypal"}}
    return PaypalServersdkClient(config=config)


@pytest.fixture
def sync_http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=30) as client:
        yield client


async def test_the_usual_client_credentials_setup_works_through_opgate(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
) -> None:
    """The SDK fetches its token from opgate (the agent's own opgate token, audited as
    oauth2_token), then creates an approved order; PayPal's token went only to PayPal."""
    op = await approve_order(paypal_gate)
    client = usual_sdk(paypal_gate)
    with capture_logs() as logs:
        created = await asyncio.to_thread(
            client.orders.create_order,
            {"body": order("10.99"), "paypal_request_id": op["idempotency_key"]},
        )
    assert created.status_code == 201, created.body
    token, sent = audits(logs)
    assert (token["rule"], token["decision"], token["agent_id"]) == (
        "oauth2_token",
        "allow",
        "agent-a",
    )
    assert sent["rule"] == "order.create"
    [upstream] = paypal.posts()
    assert upstream.headers["Authorization"] == f"Bearer {paypal.tokens.issued[0]}"
    assert all(r.path != "/v1/oauth2/token" for r in paypal.requests)
    fetched = await asyncio.to_thread(client.oauth_2.fetch_token)
    assert fetched.access_token == AGENT_TOKEN
    assert fetched.access_token not in paypal.tokens.issued


async def test_a_wrong_secret_is_the_sdks_oauth_error_with_opgates_code(
    paypal_gate: Opgate,  # noqa: F811
) -> None:
    """A client secret that is no agent's token: 401, OAuthProviderException whose error is
    agent_unauthenticated."""
    client = usual_sdk(paypal_gate, secret="not-an-opgate-token")
    with pytest.raises(OAuthProviderException) as refused:
        await asyncio.to_thread(client.oauth_2.fetch_token)
    assert refused.value.response_code == 401
    assert refused.value.error == "agent_unauthenticated"


@pytest.mark.parametrize(
    ("form", "content_type", "code"),
    [
        ("grant_type=password&username=a", "application/x-www-form-urlencoded", "body_invalid"),
        (
            "grant_type=client_credentials&grant_type=x",
            "application/x-www-form-urlencoded",
            "body_invalid",
        ),
        ('{"grant_type": "client_credentials"}', "application/json", "content_type_mismatch"),
    ],
)
async def test_only_a_client_credentials_grant_is_answered(
    paypal_gate: Opgate,  # noqa: F811
    sync_http: httpx.Client,
    form: str,
    content_type: str,
    code: str,
) -> None:
    """Another grant, a repeated field or a JSON body is refused in PayPal's shape, no token."""
    basic = base64.b64encode(f"agent-a:{AGENT_TOKEN}".encode()).decode()
    answer: Any = await asyncio.to_thread(
        sync_http.post,
        f"{paypal_gate.agent_url}/paypal/v1/oauth2/token",
        content=form,
        headers={"Authorization": f"Basic {basic}", "Content-Type": content_type},
    )
    body = answer.json()
    assert answer.status_code in (400, 415)
    assert (body["error"], body["details"][0]["issue"]) == (code, code)
    assert AGENT_TOKEN not in answer.text


async def test_the_token_answer_is_not_stored(
    paypal_gate: Opgate,  # noqa: F811
    sync_http: httpx.Client,
) -> None:
    """The answer carrying the token says Cache-Control: no-store (RFC 6749 section 5.1)."""
    answer = await asyncio.to_thread(
        sync_http.post,
        f"{paypal_gate.agent_url}/paypal/v1/oauth2/token",
        data={"grant_type": "client_credentials"},
        auth=("agent-a", AGENT_TOKEN),
    )
    assert answer.status_code == 200
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.json()["token_type"] == "Bearer"
