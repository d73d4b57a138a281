"""The console as new users found it, over real HTTP: money read one way on every page
("6.00 USD (600 minor units)"), a resolved escalation led by its verdict and who gave it,
advice that fits what the provider was sent and what opgate still does, the sign-in label
every role recognises, and required fields marked required."""

from __future__ import annotations

import html as html_module
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio

from proxy.gate.identity import token_digest
from tests.console.helpers import csrf_of, escalated, sign_in
from tests.support.localstripe_server import create_charge
from tests.support.opgate import ADMIN_TOKEN, SHIPPED_POLICIES, Opgate, StartOpgate, fault_policy

APPROVER_TOKEN = "opg_test_console_walk_approver_0123"
MONEY = "6.00 USD (600 minor units)"


def browser() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), trust_env=False)


def text_of(page: str) -> str:
    """What a person reads on a page: its text without markup, spaces collapsed."""
    body = page.split("<main>", 1)[-1]
    words = " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", body)).split())
    return re.sub(r" ([,.:;)])", r"\1", words)


def without_metadata(policy: str) -> str:
    """The fault provider's policy as for an API whose objects carry no metadata: the
    operation id is never sent to it."""
    return re.sub(r"metadata_injection: .*\n", "", policy)


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, policy_dir: Path) -> AsyncIterator[Opgate]:
    """The fault provider, no lookup declared; a tenant budget of 10.00 USD a day."""
    budget = "budgets:\n  - {scope: tenant, currency: usd, limit: 1000, window: 24h}\n"
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + budget)
    async with start_opgate(
        approvers=[{"name": "olga", "token_sha256": token_digest(APPROVER_TOKEN)}],
    ) as running:
        yield running


async def read(session: aiohttp.ClientSession, gate: Opgate, path: str) -> str:
    async with session.get(f"{gate.ops_url}{path}") as response:
        assert response.status == 200, path
        return await response.text()


async def test_money_reads_as_the_amount_and_its_minor_units_on_every_page(gate: Opgate) -> None:
    """A 600 minor-unit USD amount reads "6.00 USD (600 minor units)" on the proposal page, the
    proposals list, the operation page, the operations list, the escalations list and the
    budgets page: never a bare 600."""
    body = {
        "provider": "fault",
        "action": "refund.create",
        "amount": 600,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "reason": "order 1042 was charged twice",
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposal = json.loads(raw)["proposal"]
    op = await escalated(gate, amount=600, approval_ref="INC-9")
    async with browser() as session:
        await sign_in(gate, session, ADMIN_TOKEN)
        pages = {
            "proposal": await read(session, gate, f"/console/proposals/{proposal['proposal_id']}"),
            "proposals": await read(session, gate, "/console/proposals"),
            "operation": await read(session, gate, f"/console/operations/{op['operation_id']}"),
            "operations": await read(session, gate, "/console/operations"),
            "escalations": await read(session, gate, "/console/escalations"),
        }
        budgets = text_of(await read(session, gate, "/console/budgets"))
    for name, page in pages.items():
        # the exact request and the records are shown as sent: their amounts are the wire's
        shown = text_of(re.sub(r"<pre.*?</pre>", "", page, flags=re.DOTALL))
        assert MONEY in shown, (name, shown)
        assert re.search(r"[0-9.]+ USD(?! \([0-9]+ minor units\))", shown) is None, (name, shown)
        assert re.search(r"(?<![0-9.(])600(?! minor units)", shown) is None, (name, shown)
    assert "10.00 USD (1000 minor units)" in budgets


async def test_a_resolved_escalation_opens_with_its_verdict_and_who_gave_it(gate: Opgate) -> None:
    """After a human resolves an escalation, its page leads with the verdict, who gave it,
    when and the note; it no longer asks anyone to decide."""
    op = await escalated(gate, approval_ref="INC-10")
    page_path = f"/console/operations/{op['operation_id']}"
    async with browser() as session:
        await sign_in(gate, session, ADMIN_TOKEN, identity="alice@example.com")
        csrf = csrf_of(await read(session, gate, page_path))
        async with session.post(
            f"{gate.ops_url}{page_path}/resolve",
            data={"csrf_token": csrf, "verdict": "failed", "note": "no refund at the provider"},
            allow_redirects=False,
        ) as response:
            assert response.status == 303
        shown = text_of(await read(session, gate, page_path))
    lead = shown.split("The operation", 1)[0]
    assert "It did not happen: failed by human:alice@example.com (admin) at 20" in lead, lead
    assert "no refund at the provider" in lead
    assert "Decide" not in shown
    assert "a human must" not in shown


async def test_the_advice_fits_what_the_provider_was_sent_and_what_opgate_still_does(
    start_opgate: StartOpgate, policy_dir: Path
) -> None:
    """For a provider that was never sent the operation id and a rule with no lookup, the
    escalation does not advise searching for the id nor say opgate still looks the provider
    up: it names the approved values and the idempotency key sent, and says only a human
    settles it."""
    (policy_dir / "fault.yaml").write_text(without_metadata(fault_policy(deduplicates=False)))
    async with start_opgate() as gate, browser() as session:
        op = await escalated(gate, approval_ref="INC-11")
        await sign_in(gate, session, ADMIN_TOKEN)
        shown = text_of(await read(session, gate, f"/console/operations/{op['operation_id']}"))
    searches = shown.split("What to check at Fault", 1)[1].split("Provider object id", 1)[0]
    assert op["operation_id"] not in searches, searches
    assert "5.00 USD (500 minor units)" in searches
    assert "charge = ch_1" in searches
    assert f"Idempotency-Key = {op['idempotency_key']}" in searches
    assert "looks the provider up" not in shown
    assert "No lookup is declared for this rule" in shown


async def test_the_sign_in_names_every_token_and_required_fields_say_so(gate: Opgate) -> None:
    """The sign-in label names the admin's, the reviewer's and an approver's own token; the
    escalation's note, which a verdict needs, is marked required where it is asked for."""
    op = await escalated(gate, approval_ref="INC-12")
    async with browser() as session:
        sign_in_page = text_of(await read(session, gate, "/console/login"))
        await sign_in(gate, session, ADMIN_TOKEN)
        escalation = await read(session, gate, f"/console/operations/{op['operation_id']}")
    assert "Admin or reviewer token" not in sign_in_page
    assert "Your token: the admin's, the reviewer's or your own approver token" in sign_in_page
    note_label = re.search(r'<label for="note">(.*?)</label>', escalation)
    assert note_label is not None
    assert "required" in note_label.group(1)


@pytest_asyncio.fixture(loop_scope="session")
async def stripe_gate(start_opgate: StartOpgate, localstripe_url: str) -> AsyncIterator[Opgate]:
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"stripe": localstripe_url}
    ) as running:
        yield running


async def test_an_approved_refund_reads_in_the_currency_its_charge_has_now(
    stripe_gate: Opgate, localstripe_url: str
) -> None:
    """A Stripe refund names no currency: once approved as "6.00 USD" on the proposal page,
    its operation page says 6.00 USD as well (the charge's currency, read from Stripe as the
    proposal page reads it, and said to be), never a bare "Refund 600"."""
    gate = stripe_gate
    charge = await create_charge(localstripe_url, 2000)
    body = {
        "provider": "stripe",
        "action": "refund.create",
        "amount": 600,
        "params": {"charge": charge},
        "reason": "order 1042 was charged twice",
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposal = json.loads(raw)["proposal"]
    async with browser() as session:
        await sign_in(gate, session, ADMIN_TOKEN)
        page = await read(session, gate, f"/console/proposals/{proposal['proposal_id']}")
        async with session.post(
            f"{gate.ops_url}/console/proposals/{proposal['proposal_id']}/approve",
            data={"csrf_token": csrf_of(page)},
            allow_redirects=False,
        ) as response:
            assert response.status == 303
        shown = text_of(
            await read(session, gate, f"/console/operations/{proposal['operation_id']}")
        )
    assert shown.startswith(f"Operation {proposal['operation_id']} Refund {MONEY} of charge")
    assert f"Amount {MONEY}, in the currency Stripe gives it now" in shown
