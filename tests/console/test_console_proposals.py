"""The console's Proposals page over real HTTP: who may decide (admin and approver, never a
reviewer; an approver nothing else), CSRF on the forms, the approver's name from its token,
and an agent's words shown escaped."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio

from proxy.gate.identity import token_digest
from tests.console.helpers import REVIEWER_DIGEST, REVIEWER_TOKEN, csrf_of, escalated, sign_in
from tests.support.opgate import ADMIN_TOKEN, Opgate, StartOpgate, fault_policy

APPROVER_TOKEN = "opg_test_console_approver_abcdef0123"


@pytest_asyncio.fixture(loop_scope="session")
async def gate(start_opgate: StartOpgate, policy_dir: Path) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        reviewer_token_sha256=REVIEWER_DIGEST,
        approvers=[{"name": "olga", "token_sha256": token_digest(APPROVER_TOKEN)}],
    ) as running:
        yield running


def browser() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), trust_env=False)


async def propose(gate: Opgate, reason: str = "a double charge") -> dict[str, Any]:
    body = {
        "provider": "fault",
        "action": "refund.create",
        "amount": 500,
        "currency": "usd",
        "params": {"charge": "ch_1"},
        "reason": reason,
    }
    status, _, raw = await gate.send(
        "/_opgate/v1/proposals", data=json.dumps(body), content_type="application/json"
    )
    assert status == 201, raw
    proposal: dict[str, Any] = json.loads(raw)["proposal"]
    return proposal


async def post_decision(
    gate: Opgate, session: aiohttp.ClientSession, proposal_id: str, verdict: str, csrf: str
) -> tuple[int, str, str | None]:
    async with session.post(
        f"{gate.ops_url}/console/proposals/{proposal_id}/{verdict}",
        data={"csrf_token": csrf, "note": "checked"},
        allow_redirects=False,
    ) as response:
        return response.status, await response.text(), response.headers.get("Location")


async def test_an_approver_signs_in_as_its_name_and_decides_only_proposals(gate: Opgate) -> None:
    """An approver's session is its configured name whatever was typed; it may approve (303 to
    the new operation) and decline, but a resolve is 403, and a form without CSRF too."""
    first, second = await propose(gate), await propose(gate)
    op = await escalated(gate, approval_ref="INC-1")
    async with browser() as session:
        await sign_in(gate, session, APPROVER_TOKEN, identity="mallory")
        async with session.get(f"{gate.ops_url}/console/proposals") as page:
            html = await page.text()
        assert "olga · approver" in html
        assert first["proposal_id"] in html
        csrf = csrf_of(html)
        assert (await post_decision(gate, session, first["proposal_id"], "approve", ""))[0] == 403
        status, _, location = await post_decision(
            gate, session, first["proposal_id"], "approve", csrf
        )
        assert (status, location) == (303, f"/console/operations/{first['operation_id']}")
        status, _, location = await post_decision(
            gate, session, second["proposal_id"], "decline", csrf
        )
        assert (status, location) == (303, "/console/proposals")
        status, text, _ = await post_decision(gate, session, second["proposal_id"], "approve", csrf)
        assert status == 409
        assert "proposal_not_pending" in text
        async with session.post(
            f"{gate.ops_url}/console/operations/{op['operation_id']}/resolve",
            data={"csrf_token": csrf, "verdict": "failed", "note": "no"},
            allow_redirects=False,
        ) as response:
            assert response.status == 403
            assert "approver role decides proposals" in await response.text()
    row = await gate.operation(first["operation_id"])
    assert row["approval"]["approved_by"] == "olga"
    assert row["events"][0]["actor"] == "human:olga (approver)"


async def test_a_reviewer_sees_proposals_and_decides_none(gate: Opgate) -> None:
    """The reviewer sees the page without forms; an approval it posts anyway is 403 and the
    proposal stays pending. The admin may approve."""
    proposal = await propose(gate)
    async with browser() as session:
        await sign_in(gate, session, REVIEWER_TOKEN, identity="rita")
        async with session.get(f"{gate.ops_url}/console/proposals") as page:
            html = await page.text()
        assert proposal["proposal_id"] in html
        assert "approve-submit" not in html
        status, _, _ = await post_decision(
            gate, session, proposal["proposal_id"], "approve", csrf_of(html)
        )
        assert status == 403
    async with browser() as session:
        await sign_in(gate, session, ADMIN_TOKEN, identity="alice")
        async with session.get(f"{gate.ops_url}/console/proposals") as page:
            csrf = csrf_of(await page.text())
        status, _, _ = await post_decision(gate, session, proposal["proposal_id"], "approve", csrf)
        assert status == 303
    row = await gate.operation(proposal["operation_id"])
    assert row["approval"]["approved_by"] == "alice"


async def test_an_agents_reason_is_shown_escaped(gate: Opgate) -> None:
    """An agent's words are text on the page, never markup."""
    await propose(gate, reason="<script>alert(1)</script>")
    async with browser() as session:
        await sign_in(gate, session, APPROVER_TOKEN)
        async with session.get(f"{gate.ops_url}/console/proposals") as page:
            html = await page.text()
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_a_withdrawn_proposal_shows_as_withdrawn_and_cannot_be_decided(gate: Opgate) -> None:
    """A proposal its agent withdrew leaves the pending list for the withdrawn one, its page
    says in a sentence that the agent withdrew it (no decision form), and an approval posted
    after it is refused 409 with that reason."""
    proposal = await propose(gate)
    proposal_id = proposal["proposal_id"]
    async with browser() as session:
        await sign_in(gate, session, APPROVER_TOKEN)
        async with session.get(f"{gate.ops_url}/console/proposals/{proposal_id}") as page:
            csrf = csrf_of(await page.text())
        status, _, raw = await gate.send(
            f"/_opgate/v1/proposals/{proposal_id}/withdraw", content_type=None
        )
        assert status == 200, raw
        async with session.get(f"{gate.ops_url}/console/proposals") as page:
            listing = await page.text()
        async with session.get(f"{gate.ops_url}/console/proposals/{proposal_id}") as page:
            html = await page.text()
        status, refused, _ = await post_decision(gate, session, proposal_id, "approve", csrf)
    assert f'id="withdrawn-{proposal_id}"' in listing
    assert f'id="proposal-{proposal_id}"' not in listing
    assert 'id="decide"' not in html
    assert "Withdrawn by its agent agent-a" in html
    assert status == 409
    assert "withdrawn by its agent agent-a" in refused
