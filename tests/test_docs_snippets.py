"""The "connect your SDK" pages (docs/how-to/connect-*.md) work as written: each page's one
python snippet is run verbatim, with only OPGATE_URL and OPGATE_AGENT_TOKEN set in the
environment it reads, against opgate and the provider's fake; the client it builds then makes
an approved call and gets a refusal in its SDK's own error. The worked example's mandate
variant (docs/how-to/pay-with-a-mandate.md) runs the same way, with opgate started from the
settings its shell block names."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import stripe
from Adyen.exceptions import AdyenAPIUnprocessableEntity
from paypalserversdk.exceptions.error_exception import ErrorException
from square.core.api_error import ApiError

from tests.support.fake_adyen import FakeAdyen
from tests.support.fake_paypal import FakePayPal
from tests.support.fake_square import FakeSquare
from tests.support.localstripe_server import create_charge, list_refunds
from tests.support.opgate import AGENT_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate
from tests.support.paths import REPO

# the providers' fakes and opgate in front of each, as the SDK tests start them
from tests.support.sdk_gates import (  # noqa: F401
    PAYMENT,
    adyen,
    adyen_gate,
    approve_refund,
    order,
    paypal,
    paypal_gate,
    square,
    square_gate,
    stripe_gate,
)

HOW_TO = REPO / "docs" / "how-to"
PAGES = ["connect-stripe.md", "connect-square.md", "connect-paypal.md", "connect-adyen.md"]


def snippet(page: str) -> str:
    """The page's one fenced python block."""
    [code] = re.findall(r"^```python\n(.*?)^```", (HOW_TO / page).read_text("utf-8"), re.S | re.M)
    return code


def run_snippet(page: str, gate: Opgate, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run ``page``'s snippet as a user's module would; what it defined."""
    monkeypatch.setenv("OPGATE_URL", gate.agent_url)
    monkeypatch.setenv("OPGATE_AGENT_TOKEN", AGENT_TOKEN)
    defined: dict[str, Any] = {"__name__": page}
    exec(compile(snippet(page), str(HOW_TO / page), "exec"), defined)  # noqa: S102
    return defined


@pytest.mark.parametrize("page", PAGES)
def test_each_page_has_one_snippet_and_is_linked(page: str) -> None:
    """One python snippet per page, reading only the two variables, and providers.md links it."""
    code = snippet(page)
    assert set(re.findall(r"os\.environ\[\"(\w+)\"\]", code)) == {
        "OPGATE_URL",
        "OPGATE_AGENT_TOKEN",
    }
    assert f"({page})" in (HOW_TO / "providers.md").read_text("utf-8")


async def test_connect_stripe(
    stripe_gate: Opgate,  # noqa: F811
    localstripe_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """connect-stripe.md's client refunds an approved refund once and gets a re-planned one
    refused as InvalidRequestError amount_mismatch."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    client: stripe.StripeClient = run_snippet("connect-stripe.md", stripe_gate, monkeypatch)[
        "client"
    ]
    charge = await create_charge(localstripe_url, 2000)
    op = await approve_refund(stripe_gate, charge, 500)

    def refund(amount: int) -> stripe.Refund:
        return client.v1.refunds.create(
            params={"charge": charge, "amount": amount},
            options={"idempotency_key": op["idempotency_key"]},
        )

    with pytest.raises(stripe.InvalidRequestError) as refused:
        await asyncio.to_thread(refund, 700)
    assert refused.value.code == "amount_mismatch"
    done = await asyncio.to_thread(refund, 500)
    [at_stripe] = await list_refunds(localstripe_url, charge=charge)
    assert at_stripe["id"] == done.id


async def test_connect_square(
    square_gate: Opgate,  # noqa: F811
    square: FakeSquare,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """connect-square.md's client pays an approved payment once, and a re-planned amount is
    the SDK's ApiError amount_mismatch."""
    client = run_snippet("connect-square.md", square_gate, monkeypatch)["square"]
    op = await square_gate.approve(
        provider="square",
        action="payment.create",
        amount=1099,
        currency="USD",
        params={"/source_id": "cnon:card-nonce-ok"},
    )

    def pay(amount: int) -> Any:
        return client.payments.create(
            idempotency_key=op["idempotency_key"],
            source_id="cnon:card-nonce-ok",
            amount_money={"amount": amount, "currency": "USD"},
        )

    try:
        with pytest.raises(ApiError) as refused:
            await asyncio.to_thread(pay, 2000)
        assert refused.value.errors[0].code == "amount_mismatch"
        paid = await asyncio.to_thread(pay, 1099)
        assert paid.payment.reference_id == op["operation_id"]
        assert len(square.payments_committed()) == 1
    finally:  # the httpx.Client the SDK made for itself (a user's process would just exit)
        client._client_wrapper.httpx_client.httpx_client.close()


async def test_connect_paypal(
    paypal_gate: Opgate,  # noqa: F811
    paypal: FakePayPal,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """connect-paypal.md's client creates an approved order once, and a re-planned amount is
    the SDK's ErrorException amount_mismatch."""
    client = run_snippet("connect-paypal.md", paypal_gate, monkeypatch)["paypal"]
    op = await paypal_gate.approve(
        provider="paypal",
        action="order.create",
        amount=1099,
        currency="USD",
        params={"/intent": "CAPTURE"},
    )

    def create(value: str) -> Any:
        return client.orders.create_order(
            {"body": order(value), "paypal_request_id": op["idempotency_key"]}
        )

    with pytest.raises(ErrorException) as refused:
        await asyncio.to_thread(create, "20.00")
    assert refused.value.details[0].issue == "amount_mismatch"
    created = await asyncio.to_thread(create, "10.99")
    assert created.status_code == 201
    assert created.body.purchase_units[0].custom_id == op["operation_id"]
    assert len(paypal.effects) == 1


async def test_connect_adyen(
    adyen_gate: Opgate,  # noqa: F811
    adyen: FakeAdyen,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """connect-adyen.md's client pays and refunds through opgate (both services point at it),
    and a re-planned amount is AdyenAPIUnprocessableEntity amount_mismatch."""
    client = run_snippet("connect-adyen.md", adyen_gate, monkeypatch)["adyen"]
    op = await adyen_gate.approve(
        provider="adyen",
        action="payment.create",
        amount=1099,
        currency="EUR",
        params={"/merchantAccount": "AcmeCOM"},
    )
    replanned = {**PAYMENT, "amount": {"value": 2000, "currency": "EUR"}}
    with pytest.raises(AdyenAPIUnprocessableEntity) as refused:
        await asyncio.to_thread(
            client.checkout.payments_api.payments, replanned, idempotency_key=op["idempotency_key"]
        )
    assert refused.value.error_code == "amount_mismatch"
    paid = await asyncio.to_thread(
        client.checkout.payments_api.payments, dict(PAYMENT), idempotency_key=op["idempotency_key"]
    )
    psp = paid.message["pspReference"]
    refund_op = await adyen_gate.approve(
        provider="adyen",
        action="payment.refund",
        path_params={"payment": psp},
        amount=500,
        currency="EUR",
        params={"/merchantAccount": "AcmeCOM"},
    )
    refunded = await asyncio.to_thread(
        client.checkout.modifications_api.refund_captured_payment,
        {"merchantAccount": "AcmeCOM", "amount": {"value": 500, "currency": "EUR"}},
        psp,
        idempotency_key=refund_op["idempotency_key"],
    )
    assert refunded.message["reference"] == refund_op["operation_id"]
    assert [e["kind"] for e in adyen.effects] == ["payment", "refund"]


MANDATE_PAGE = HOW_TO / "pay-with-a-mandate.md"


def blocks(language: str) -> list[str]:
    """The mandate page's fenced blocks of ``language``, in order."""
    text = MANDATE_PAGE.read_text("utf-8")
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.S | re.M)


def documented_setting(shell: str, name: str) -> str:
    """The value the page's shell block gives ``OPGATE_<name>`` (quotes removed)."""
    found = re.search(rf"OPGATE_{name}=('[^']*'|\S+)", shell)
    assert found is not None, name
    return found.group(1).strip("'")


async def test_pay_with_a_mandate(
    start_opgate: StartOpgate,
    localstripe_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pay-with-a-mandate.md runs as written: its key block, then opgate with the mandate
    settings its shell block names, then the person-and-agent block, which pays once through
    the Stripe SDK and reads a receipt, verified with opgate's published key, saying
    confirmed with localstripe's payment intent id."""
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    monkeypatch.chdir(tmp_path)  # the page writes and reads its key files where it runs
    keys, person_and_agent = blocks("python")
    exec(compile(keys, str(MANDATE_PAGE), "exec"), {"__name__": "keys"})  # noqa: S102
    shell = "\n".join(blocks("sh"))
    issuers = json.loads(documented_setting(shell, "MANDATE_ISSUERS"))
    for issuer in issuers:
        issuer["tenants"] = ["t1"]  # the test agent's tenant (the page's is dev mode's demo)
        issuer["jwks_file"] = str(tmp_path / issuer["jwks_file"])
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES,
        upstream_overrides={"stripe": localstripe_url},
        mandate_issuers=issuers,
        mandate_audience=documented_setting(shell, "MANDATE_AUDIENCE"),
        receipt_key_file=tmp_path / documented_setting(shell, "RECEIPT_KEY_FILE"),
    ) as gate:
        monkeypatch.setenv("OPGATE_URL", gate.agent_url)
        monkeypatch.setenv("OPGATE_AGENT_TOKEN", AGENT_TOKEN)
        defined: dict[str, Any] = {"__name__": "person_and_agent"}
        code = compile(person_and_agent, str(MANDATE_PAGE), "exec")
        # blocking HTTP (urllib, the SDK) against the opgate this loop runs: in a thread
        await asyncio.to_thread(exec, code, defined)
    assert defined["claims"]["status"] == "Success"
    assert defined["ended"]["settled"] is True
    assert defined["ended"]["operation"]["operation"]["status"] == "confirmed"
    assert defined["claims"]["payment_id"] == defined["intent"].id
    assert defined["intent"].metadata["operation_id"] == defined["op"]["operation_id"]
    assert defined["op"]["approval"]["approved_by"] == "surface:alice@example.com"
