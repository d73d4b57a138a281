"""APIs with no idempotency key, end to end, as docs/how-to/apis-without-idempotency.md tells a
user to run them: its example policy (taken from the page) and the two shipped ones (Twilio,
GitHub) in front of small fakes that count what they receive. Each approved operation reaches
the provider once; an unknown outcome is never re-sent but goes to a human, who settles it."""

from __future__ import annotations

import base64
import json
import re
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.support.fake_provider_base import FakeProvider, serving
from tests.support.opgate import (
    AGENT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    admin_headers,
    problem,
)
from tests.support.paths import REPO

PAGE = REPO / "docs" / "how-to" / "apis-without-idempotency.md"
HELPDESK_SECRET = base64.b64encode(b"ops@shop.example:helpdesk-password").decode()
TWILIO_SECRET = base64.b64encode(b"AC123:twilio-auth-token").decode()


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def page_policy() -> str:
    """The page's example policy, as a user copies it."""
    [block] = re.findall(r"```yaml\n(.*?)```", PAGE.read_text(), re.DOTALL)
    return block


class CountingProvider(FakeProvider):
    """Creates one object per POST (an SMS, an issue, a ticket), whatever it was sent before:
    an API with no idempotency key. ``answer_next`` makes the next answer a 503 sent after the
    object was created: the outcome opgate cannot know."""

    def __init__(self, credential: str, created: Any) -> None:
        super().__init__()
        self.credential = credential
        self.created = created  # (request body, path params) -> the object's JSON
        self.answer_next: int | None = None

    def app(self, post_path: str, get_path: str) -> web.Application:
        app = web.Application()
        app.router.add_post(post_path, self.create)
        app.router.add_get(get_path, self.read)
        return app

    async def create(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.headers.get("Authorization") != self.credential:
            return web.json_response({"message": "Bad credentials"}, status=401)
        if isinstance(body, str):  # a form
            body = dict(re.findall(r"([^&=]+)=([^&]*)", body))
        made = self.created(body, dict(request.match_info))
        self.effects.append(made)
        if self.answer_next is not None:
            status, self.answer_next = self.answer_next, None
            return web.json_response({"message": "try again"}, status=status)
        return web.json_response(made, status=201)

    async def read(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"items": self.effects})


@pytest_asyncio.fixture(loop_scope="session")
async def helpdesk() -> AsyncIterator[CountingProvider]:
    fake = CountingProvider(
        f"Basic {HELPDESK_SECRET}",
        lambda body, _: {"ticket": {"id": f"T{secrets.token_hex(3)}", **body["ticket"]}},
    )
    async with serving(fake.app("/api/tickets", "/api/{rest:.*}"), fake):
        yield fake


@pytest_asyncio.fixture(loop_scope="session")
async def helpdesk_gate(
    start_opgate: StartOpgate,
    policy_dir: Path,
    helpdesk: CountingProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Opgate]:
    """opgate with the page's policy, as written, and its secret configured as the page says."""
    (policy_dir / "helpdesk.yaml").write_text(page_policy())
    monkeypatch.setenv("OPGATE_SECRET_HELPDESK_BASIC", HELPDESK_SECRET)
    async with start_opgate(upstream_overrides={"helpdesk": helpdesk.url}) as gate:
        yield gate


TICKET = {
    "subject": "Refund failed for order 7",
    "requester": "ana@example.com",
    "tags": ["billing", "urgent"],
}


async def approve_ticket(gate: Opgate) -> dict[str, Any]:
    return await gate.approve(
        provider="helpdesk",
        action="ticket.create",
        amount=None,
        currency=None,
        params={"/ticket/subject": TICKET["subject"], "/ticket/requester": TICKET["requester"]},
    )


async def send_ticket(
    gate: Opgate, operation_id: str, ticket: dict[str, Any] = TICKET
) -> tuple[int, dict[str, Any]]:
    """The agent's request, as the page writes it: HTTP Basic with the opgate token as the
    password, the operation named by X-Operation-Id."""
    async with gate.http.post(
        f"{gate.agent_url}/helpdesk/api/tickets",
        headers={"Authorization": basic("agent", AGENT_TOKEN), "X-Operation-Id": operation_id},
        json={"ticket": ticket},
    ) as response:
        return response.status, await response.json(content_type=None)


async def ops(gate: Opgate, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations/{path}", json=body or {}, headers=admin_headers()
    ) as response:
        payload: dict[str, Any] = await response.json(content_type=None)
        assert response.status == 200, payload
        return payload


async def test_the_pages_policy_sends_each_approved_ticket_once(
    helpdesk_gate: Opgate, helpdesk: CountingProvider
) -> None:
    """The page's policy as written: the ticket leaves once with opgate's Basic credential and
    its free list of tags, a retry is the stored answer, and another subject is refused."""
    op = await approve_ticket(helpdesk_gate)
    status, created = await send_ticket(helpdesk_gate, op["operation_id"])
    assert status == 201, created
    assert created["ticket"]["tags"] == ["billing", "urgent"]
    again_status, again = await send_ticket(helpdesk_gate, op["operation_id"])
    assert (again_status, again) == (201, created)
    status, refused = await send_ticket(
        helpdesk_gate, op["operation_id"], {**TICKET, "subject": "Something else"}
    )
    assert (status, refused["code"]) == (422, "parameter_mismatch"), refused
    assert len(helpdesk.posts()) == 1
    assert helpdesk.posts()[0].headers["Authorization"] == f"Basic {HELPDESK_SECRET}"
    row = await helpdesk_gate.operation(op["operation_id"])
    assert row["status"] == "confirmed"


async def test_an_unknown_outcome_goes_to_a_human_and_is_never_re_sent(
    helpdesk_gate: Opgate, helpdesk: CountingProvider
) -> None:
    """The provider created the ticket but answered 503: the agent's retries are refused (no
    key: a re-send could act twice), reconciling escalates it, and the human's verdict
    settles it; the provider received one request in all."""
    op = await approve_ticket(helpdesk_gate)
    helpdesk.answer_next = 503
    status, unknown = await send_ticket(helpdesk_gate, op["operation_id"])
    assert (status, unknown.get("code")) == (502, "outcome_unknown"), unknown
    status, refused = await send_ticket(helpdesk_gate, op["operation_id"])
    assert (status, refused["code"]) == (409, "reconcile_required"), refused
    assert "carries no idempotency key" in refused["detail"], refused

    reconciled = await ops(helpdesk_gate, f"{op['operation_id']}/reconcile")
    assert reconciled["next_action"] == "escalated", reconciled
    status, refused = await send_ticket(helpdesk_gate, op["operation_id"])
    assert (status, refused["code"]) == (409, "operation_escalated"), refused

    # The human's search: the approved subject among what the provider holds.
    [found] = [t for t in helpdesk.effects if t["ticket"]["subject"] == TICKET["subject"]]
    resolved = await ops(
        helpdesk_gate,
        f"{op['operation_id']}/resolve",
        {
            "verdict": "confirmed",
            "object_id": found["ticket"]["id"],
            "note": "found in the helpdesk by subject, created during attempt 1",
            "decided_by": "bob@example.com",
        },
    )
    assert resolved["operation"]["status"] == "confirmed", resolved
    assert len(helpdesk.posts()) == 1  # the only request it received, the retries never left


@pytest_asyncio.fixture(loop_scope="session")
async def twilio() -> AsyncIterator[CountingProvider]:
    fake = CountingProvider(
        f"Basic {TWILIO_SECRET}",
        lambda body, path: {"sid": f"SM{secrets.token_hex(16)}", "account_sid": path["account"]},
    )
    path = "/2010-04-01/Accounts/{account}/Messages.json"
    async with serving(fake.app(path, "/2010-04-01/{rest:.*}"), fake):
        yield fake


async def test_the_shipped_twilio_policy_sends_an_approved_sms_once(
    start_opgate: StartOpgate, twilio: CountingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """policies/twilio.yaml: the SMS leaves once, with opgate's account credential (the agent
    authenticates as Twilio's SDK does, its opgate token as the Basic password)."""
    monkeypatch.setenv("OPGATE_SECRET_TWILIO_BASIC_CREDENTIALS", TWILIO_SECRET)
    message = {"To": "+15558675310", "From": "+15017122661", "Body": "Your order 7 has shipped."}
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"twilio": twilio.url}
    ) as gate:
        op = await gate.approve(
            provider="twilio",
            action="message.send",
            amount=None,
            currency=None,
            params=message,
            path_params={"account": "AC123"},
        )
        answers = []
        for _ in range(2):
            async with gate.http.post(
                f"{gate.agent_url}/twilio/2010-04-01/Accounts/AC123/Messages.json",
                headers={
                    "Authorization": basic("AC123", AGENT_TOKEN),
                    "X-Operation-Id": op["operation_id"],
                },
                data=message,
            ) as response:
                answers.append((response.status, await response.json(content_type=None)))
        assert answers[0][0] == 201, answers
        assert answers[1] == answers[0]
    assert len(twilio.posts()) == 1
    assert twilio.posts()[0].headers["Authorization"] == f"Basic {TWILIO_SECRET}"
    assert "To=%2B15558675310&" in twilio.posts()[0].body


@pytest_asyncio.fixture(loop_scope="session")
async def github() -> AsyncIterator[CountingProvider]:
    fake = CountingProvider(
        "Bearer ghp_opgate",
        lambda body, path: {
            "number": 7,
            "html_url": f"https://github.com/{path['owner']}/{path['repo']}/issues/7",
            **body,
        },
    )
    async with serving(fake.app("/repos/{owner}/{repo}/issues", "/{rest:.*}"), fake):
        yield fake


async def test_the_shipped_github_policy_opens_an_approved_issue_once(
    start_opgate: StartOpgate, github: CountingProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """policies/github.yaml: the issue opens once, its free lists of labels and assignees
    through item by item; a milestone nobody approved is refused before GitHub sees it."""
    monkeypatch.setenv("OPGATE_SECRET_GITHUB_TOKEN", "ghp_opgate")
    issue = {"title": "Refund failed for order 7", "body": "The card was declined."}
    async with start_opgate(
        policy_dir=SHIPPED_POLICIES, upstream_overrides={"github": github.url}
    ) as gate:
        op = await gate.approve(
            provider="github",
            action="issue.create",
            amount=None,
            currency=None,
            params={"/title": issue["title"], "/body": issue["body"]},
            path_params={"owner": "acme", "repo": "shop"},
        )
        sent = {
            **issue,
            "labels": ["bug", "payments"],
            "assignees": ["octocat", "hubot"],
        }
        results = []
        for body in ({**sent, "milestone": 3}, sent, sent):
            status, _, raw = await gate.send(
                "/github/repos/acme/shop/issues",
                data=json.dumps(body),
                headers={"X-Operation-Id": op["operation_id"]},
                content_type="application/json",
            )
            results.append((status, raw))
        assert results[0][0] == 422
        assert problem(results[0][1])["code"] == "parameter_unexpected"
        assert results[1][0] == 201, results[1]
        assert results[2] == results[1]
    [received] = github.posts()
    assert received.body["assignees"] == ["octocat", "hubot"]
    assert received.headers["Authorization"] == "Bearer ghp_opgate"
