"""The in-process localstripe fixture and its ground-truth helpers behave as the tests rely on."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import requests
import stripe

from tests.support.localstripe_server import (
    LOCALSTRIPE_API_KEY,
    create_charge,
    create_payment_intent,
    list_refunds,
)


@pytest.fixture
def stripe_client(
    localstripe_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[stripe.StripeClient]:
    """An official SDK client aimed straight at localstripe, with its own closed-at-end session.

    The SDK's RequestsClient keeps one session per thread unless given one; handing it our own
    session means ``close()`` really closes every connection ``asyncio.to_thread`` opened, and
    ``trust_env=False`` keeps proxy variables from rerouting it.
    """
    monkeypatch.setattr(stripe, "enable_telemetry", False)
    session = requests.Session()
    session.trust_env = False
    client = stripe.StripeClient(
        "sk_test_sdk_direct",
        base_addresses={"api": localstripe_url},
        http_client=stripe.RequestsClient(session=session),
    )
    yield client
    session.close()


async def test_localstripe_listens_on_loopback(localstripe_url: str) -> None:
    """The fixture serves localstripe on 127.0.0.1 and it refuses an unauthenticated call."""
    assert localstripe_url.startswith("http://127.0.0.1:")
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{localstripe_url}/v1/charges") as r,
    ):
        assert r.status == 401


async def test_sdk_refund_with_operation_id_is_seen_by_list_refunds(
    localstripe_url: str, stripe_client: stripe.StripeClient
) -> None:
    """A refund made through the stripe SDK, with metadata, is visible to list_refunds."""
    charge_id = await create_charge(localstripe_url, 1500)
    assert charge_id.startswith("ch_")

    refund = await asyncio.to_thread(
        stripe_client.v1.refunds.create,
        {"charge": charge_id, "amount": 500, "metadata": {"operation_id": "op_sdk_1"}},
        {"idempotency_key": "idem-sdk-1", "headers": {"X-Operation-Id": "op_sdk_1"}},
    )

    refunds = await list_refunds(localstripe_url, charge=charge_id)
    assert [(r["id"], r["amount"], r["metadata"]) for r in refunds] == [
        (refund.id, 500, {"operation_id": "op_sdk_1"})
    ]


async def test_localstripe_ignores_idempotency_key(
    localstripe_url: str, stripe_client: stripe.StripeClient
) -> None:
    """Two refunds with the same Idempotency-Key are two refunds: every duplicate is visible."""
    charge_id = await create_charge(localstripe_url, 1000)
    for _ in range(2):
        await asyncio.to_thread(
            stripe_client.v1.refunds.create,
            {"charge": charge_id, "amount": 100},
            {"idempotency_key": "same-key"},
        )
    assert len(await list_refunds(localstripe_url, charge=charge_id)) == 2


async def test_payment_intent_is_refundable(localstripe_url: str) -> None:
    """create_payment_intent returns a confirmed intent whose refunds list_refunds finds."""
    intent_id = await create_payment_intent(localstripe_url, 2000, "eur")
    assert intent_id.startswith("pi_")
    assert await list_refunds(localstripe_url, payment_intent=intent_id) == []

    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {LOCALSTRIPE_API_KEY}"}) as s,
        s.post(
            f"{localstripe_url}/v1/refunds",
            data={"payment_intent": intent_id, "metadata[operation_id]": "op_pi"},
        ) as r,
    ):
        assert r.status == 200

    [refund] = await list_refunds(localstripe_url, payment_intent=intent_id)
    assert (refund["amount"], refund["currency"], refund["metadata"]) == (
        2000,
        "eur",
        {"operation_id": "op_pi"},
    )


async def test_declined_card_is_402(localstripe_url: str) -> None:
    """localstripe's failing test card answers 402 card_declined, for tests of provider refusals."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {LOCALSTRIPE_API_KEY}"}) as s,
        s.post(
            f"{localstripe_url}/v1/charges",
            data={"amount": "100", "currency": "usd", "source": "pm_card_chargeCustomerFail"},
        ) as r,
    ):
        assert r.status == 402
        assert (await r.json())["error"]["code"] == "card_declined"


async def test_list_refunds_needs_exactly_one_filter(localstripe_url: str) -> None:
    """list_refunds refuses to list every refund in the store, which other tests share."""
    with pytest.raises(TypeError):
        await list_refunds(localstripe_url)


def _mtime(path: Path) -> int | None:
    """The file's modification time in ns, or None when it does not exist."""
    return path.stat().st_mtime_ns if path.exists() else None


async def test_store_is_not_written_to_disk(localstripe_url: str) -> None:
    """Writes through the fixture never touch localstripe's fixed pickle path."""
    pickle = Path("/tmp/localstripe.pickle")  # noqa: S108 - localstripe's own path, only read
    before = await asyncio.to_thread(_mtime, pickle)
    await create_charge(localstripe_url, 100)
    assert await asyncio.to_thread(_mtime, pickle) == before


REPO = Path(__file__).resolve().parents[2]
# The worked example's command (README): `./dev localstripe` runs this module in the venv.
DOCUMENTED = ["-m", "tests.support.localstripe_server"]


def _listening_addresses(port: int) -> list[str]:
    """The local addresses of every TCP socket listening on ``port`` (/proc/net/tcp{,6})."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_the_documented_wrapper_is_what_dev_runs() -> None:
    """`./dev localstripe` runs the wrapper module this file tests, not the localstripe CLI."""
    script = (REPO / "dev").read_text()
    assert "localstripe)" in script
    assert ".venv/bin/python " + " ".join(DOCUMENTED) in script
    readme = (REPO / "README.md").read_text()
    assert "./dev localstripe" in readme
    assert "bin/localstripe" not in readme


async def test_the_wrapper_listens_on_loopback_only_and_keeps_no_pickle() -> None:
    """The worked example's localstripe, run as documented, listens on 127.0.0.1 and nowhere
    else, answers the SDK's calls, and writes nothing to /tmp/localstripe.pickle."""
    pickle = Path("/tmp/localstripe.pickle")  # noqa: S108 - localstripe's own path, only read
    before = await asyncio.to_thread(_mtime, pickle)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        *DOCUMENTED,
        "--port",
        "0",
        cwd=REPO,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stderr is not None
        banner = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
        url = banner.split()[1]
        assert url.startswith("http://127.0.0.1:"), banner
        port = int(url.rsplit(":", 1)[1])
        assert await asyncio.to_thread(_listening_addresses, port) == ["0100007F"]  # 127.0.0.1
        charge = await create_charge(url, 700)
        assert charge.startswith("ch_")
        assert await asyncio.to_thread(_mtime, pickle) == before
    finally:
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
    assert code == 0
