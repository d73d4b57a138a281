"""The console over real HTTP (aiohttp's client, a cookie jar like a browser's): sign-in and
sessions, roles, CSRF, the security headers, filters, timelines and escaping."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest_asyncio
from yarl import URL

from proxy.console.render import CONTENT_SECURITY_POLICY
from proxy.store import queries
from proxy.store.store import Claim
from tests.console.helpers import (
    REVIEWER_DIGEST,
    REVIEWER_TOKEN,
    TRACE_TEMPLATE,
    csrf_of,
    escalated,
    sign_in,
)
from tests.support.fault_provider import FaultProvider
from tests.support.opgate import ADMIN_TOKEN, AGENT_TOKEN, Opgate, StartOpgate, fault_policy

GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


@pytest_asyncio.fixture(loop_scope="session")
async def console_gate(
    start_opgate: StartOpgate, policy_dir, fault_provider: FaultProvider
) -> AsyncIterator[Opgate]:
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(
        upstream_overrides={"fault": fault_provider.url},
        reviewer_token_sha256=REVIEWER_DIGEST,
        trace_url_template=TRACE_TEMPLATE,
    ) as gate:
        yield gate


def browser() -> aiohttp.ClientSession:
    # unsafe: the jar keeps cookies of an IP address host (127.0.0.1), as a browser does
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True), trust_env=False)


async def test_sign_in_gives_a_strict_http_only_session_cookie(console_gate: Opgate) -> None:
    """The admin token signs in to a session cookie that is HttpOnly and SameSite=Strict (not
    Secure on a plain-HTTP listener), and every page carries the strict CSP."""
    async with browser() as session:
        response = await sign_in(console_gate, session, ADMIN_TOKEN)
        assert response.status == 303
        assert response.headers["Location"] == "/console/operations"
        cookie = next(
            c for c in response.headers.getall("Set-Cookie") if c.startswith("opgate_console=")
        )
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        assert "Secure" not in cookie
        assert "Path=/console" in cookie
        async with session.get(f"{console_gate.ops_url}/console/operations") as page:
            assert page.status == 200
            assert page.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert "default-src 'none'" in CONTENT_SECURITY_POLICY
            assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY
            html = await page.text()
        assert "alice@example.com · admin" in html
        assert "<script" not in html


async def test_a_wrong_token_or_no_session_gets_no_page(console_gate: Opgate) -> None:
    """A token that is neither admin nor reviewer gets no session; without one, every page
    sends the browser to sign in and every POST is refused."""
    async with browser() as session:
        response = await sign_in(console_gate, session, AGENT_TOKEN)
        assert response.status == 401
        assert not any(
            c.startswith("opgate_console=") for c in response.headers.getall("Set-Cookie", [])
        )
        async with session.get(
            f"{console_gate.ops_url}/console/operations", allow_redirects=False
        ) as page:
            assert (page.status, page.headers["Location"]) == (303, "/console/login")
        async with session.post(
            f"{console_gate.ops_url}/console/operations/x/resolve", data={"note": "n"}
        ) as post:
            assert post.status == 401


async def test_the_admin_api_token_does_not_open_the_console(console_gate: Opgate) -> None:
    """The bearer token of the operations API is not a console session: the console asks
    for sign-in, so a page is never rendered for a request a browser did not sign in."""
    async with console_gate.http.get(
        f"{console_gate.ops_url}/console/operations",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        allow_redirects=False,
    ) as page:
        assert page.status == 303


async def test_forms_need_the_sessions_csrf_token(console_gate: Opgate) -> None:
    """A resolve without the session's CSRF token (or with another's) is refused and changes
    nothing."""
    op = await escalated(console_gate)
    url = f"{console_gate.ops_url}/console/operations/{op['operation_id']}/resolve"
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN)
        for csrf in (None, "forged"):
            form = {"verdict": "failed", "note": "no effect"}
            if csrf:
                form["csrf_token"] = csrf
            async with session.post(url, data=form) as response:
                assert response.status == 403
                assert "CSRF" in await response.text()
    row = await console_gate.operation(op["operation_id"])
    assert row["status"] == "dispatched"


async def test_a_reviewer_sees_everything_and_changes_nothing(console_gate: Opgate) -> None:
    """The reviewer sees the escalation queue without a resolve form, and its resolve POST
    (with a valid CSRF token) is 403 and leaves the operation as it was."""
    op = await escalated(console_gate)
    async with browser() as session:
        await sign_in(console_gate, session, REVIEWER_TOKEN, identity="rita")
        async with session.get(f"{console_gate.ops_url}/console/escalations") as page:
            html = await page.text()
        assert op["operation_id"] in html
        assert "rita · reviewer" in html
        assert "/resolve" not in html
        async with session.get(
            f"{console_gate.ops_url}/console/operations/{op['operation_id']}"
        ) as page:
            timeline = await page.text()
        assert 'id="resolve"' not in timeline
        async with session.post(
            f"{console_gate.ops_url}/console/operations/{op['operation_id']}/resolve",
            data={
                "csrf_token": csrf_of(timeline),
                "verdict": "failed",
                "note": "reviewer tries",
            },
        ) as response:
            assert response.status == 403
            assert "reviewer" in await response.text()
    row = await console_gate.operation(op["operation_id"])
    assert row["status"] == "dispatched"


async def test_an_admin_resolves_and_the_verdict_names_the_human(console_gate: Opgate) -> None:
    """The admin's resolve settles the operation and its event records the signed-in name."""
    op = await escalated(console_gate)
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN, identity="bob@example.com")
        async with session.get(f"{console_gate.ops_url}/console/escalations") as page:
            csrf = csrf_of(await page.text())
        async with session.post(
            f"{console_gate.ops_url}/console/operations/{op['operation_id']}/resolve",
            data={"csrf_token": csrf, "verdict": "confirmed", "object_id": "re_9", "note": "seen"},
        ) as response:
            assert response.status == 200  # the redirect to the timeline, followed
            assert str(response.url).endswith(f"/console/operations/{op['operation_id']}")
    row = await console_gate.operation(op["operation_id"])
    assert (row["status"], row["settled_reason"]) == ("confirmed", "human_verdict")
    resolved = [e for e in row["events"] if e["event"] == "resolved"]
    assert resolved[0]["actor"] == "human:bob@example.com (admin)"


async def test_signing_out_ends_the_session_on_the_server(console_gate: Opgate) -> None:
    """After sign-out, the old cookie value (replayed) opens nothing."""
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN)
        cookie = session.cookie_jar.filter_cookies(URL(f"{console_gate.ops_url}/console/"))[
            "opgate_console"
        ].value
        async with session.get(f"{console_gate.ops_url}/console/operations") as page:
            csrf = csrf_of(await page.text())
        async with session.post(
            f"{console_gate.ops_url}/console/logout", data={"csrf_token": csrf}
        ) as out:
            assert out.status == 200
    async with console_gate.http.get(
        f"{console_gate.ops_url}/console/operations",
        headers={"Cookie": f"opgate_console={cookie}"},
        allow_redirects=False,
    ) as page:
        assert page.status == 303


async def test_a_session_expires(
    start_opgate: StartOpgate, policy_dir, fault_provider: FaultProvider
) -> None:
    """A session past console_session_seconds opens nothing: the browser signs in again."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with start_opgate(console_session_seconds=0.2) as gate, browser() as session:
        assert (await sign_in(gate, session, ADMIN_TOKEN)).status == 303
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            async with session.get(
                f"{gate.ops_url}/console/operations", allow_redirects=False
            ) as page:
                if page.status == 303:
                    break
            assert asyncio.get_running_loop().time() < deadline, "the session never expired"
            await asyncio.sleep(0.05)


async def test_filters_and_escaping(console_gate: Opgate) -> None:
    """Filters by tenant, status and age select the rows; a tenant name and a note holding
    <script> are shown escaped, never as markup."""
    hostile = "<script>alert(1)</script>"
    plain = await console_gate.approve(tenant="t-plain", approval_ref="p-1")
    marked = await escalated(console_gate, tenant=hostile, approval_ref="h-1")
    ops = f"{console_gate.ops_url}/console/operations"
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN)
        async with session.get(ops, params={"tenant": "t-plain"}) as page:
            html = await page.text()
        assert plain["operation_id"] in html
        assert marked["operation_id"] not in html
        async with session.get(ops, params={"status": "dispatched"}) as page:
            html = await page.text()
        assert marked["operation_id"] in html
        assert plain["operation_id"] not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert hostile not in html
        async with session.get(ops, params={"status": "all", "age": "1d"}) as page:
            html = await page.text()
        assert plain["operation_id"] not in html  # younger than a day
        async with session.get(ops, params={"status": "nonsense"}) as page:
            assert page.status == 400
        timeline_url = f"{ops}/{quote(marked['operation_id'], safe='')}"
        async with session.get(timeline_url) as page:
            csrf = csrf_of(await page.text())
        async with session.post(
            f"{timeline_url}/resolve",
            data={"csrf_token": csrf, "verdict": "failed", "note": hostile},
        ) as response:
            html = await response.text()
        assert response.status == 200
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert hostile not in html


async def test_the_timeline_shows_requests_with_trace_links(console_gate: Opgate) -> None:
    """An operation sent through opgate: its timeline shows the transitions, the request
    record (decision, agent, attempt, provider status) with its trace id linked by
    trace_url_template, and the provider's stored answer. The agent sends trace context: with
    no exporter configured, a request that brings none has no span and no trace id."""
    op = await console_gate.approve()
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    status, _, _ = await console_gate.send(
        "/fault/v1/refunds",
        data=GOOD_BODY,
        headers={
            "X-Operation-Id": op["operation_id"],
            "traceparent": f"00-{trace_id}-00f067aa0ba902b7-01",
        },
    )
    assert status == 200
    await console_gate.running.gateway.observability.writer.flush()  # type: ignore[union-attr]
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN)
        async with session.get(
            f"{console_gate.ops_url}/console/operations/{op['operation_id']}"
        ) as page:
            html = await page.text()
    requests_table = html.split('id="requests"')[1].split("</table>")[0]
    assert "allow" in requests_table
    assert "agent-a" in requests_table
    links = re.findall(r'href="https://jaeger\.example/trace/([0-9a-f]{32})"', requests_table)
    assert links == [trace_id]
    transitions = html.split('id="transitions"')[1].split("</table>")[0]
    for event in ("created", "claimed", "confirmed"):
        assert f"<td>{event}</td>" in transitions
    assert 'id="answer"' in html
    assert "proceed" in html


async def test_the_audit_page_names_an_instance_that_ended_without_a_clean_stop(
    console_gate: Opgate, database_url: str
) -> None:
    """A run whose trace stopped coming without a clean stop is named on the audit page, with
    the records it numbered and never stored."""
    trace = {
        "run_id": "run-console", "instance_id": "gone:1", "stream": "requests/gone:1",
        "numbered_seq": 7, "stored_seq": 5, "heartbeat_seconds": 0.001, "stopped": False,
    }  # fmt: skip
    conn = await asyncpg.connect(database_url)
    try:
        await queries.execute(conn, "audit_run_seen", run=json.dumps(trace))
    finally:
        await conn.close()
    async with browser() as session:
        await sign_in(console_gate, session, REVIEWER_TOKEN)
        async with session.get(f"{console_gate.ops_url}/console/audit") as page:
            html = await page.text()
    assert (
        "instance gone:1 ended without a clean stop; at least 2 records after seq 5 are"
        " unaccounted for"
    ) in html


async def test_the_audit_page_verifies_on_demand(console_gate: Opgate) -> None:
    """The audit page says nothing was verified yet, then runs verify on demand and shows
    the chain intact, and shows the writer's pending records."""
    async with browser() as session:
        await sign_in(console_gate, session, REVIEWER_TOKEN)
        async with session.get(f"{console_gate.ops_url}/console/audit") as page:
            html = await page.text()
        assert "Not verified since this process started" in html
        assert re.search(r'id="writer">\d+ pending', html)
        async with session.get(f"{console_gate.ops_url}/console/audit?verify=1") as page:
            html = await page.text()
        assert re.search(r'id="verification">\s*intact at', html), html


async def test_a_revocation_after_a_send_reads_as_one_that_un_sent_nothing(
    console_gate: Opgate,
) -> None:
    """An operation revoked after its attempt ended unknown reads, on its page, as revoked
    after it may have been sent, still counted against its budgets; one revoked before any
    send reads as plainly revoked."""
    sent, unsent = await console_gate.approve(), await console_gate.approve()
    store = console_gate.running.gateway.store
    assert await store.claim(
        Claim(sent["operation_id"], owner="t", lease_seconds=60, expected_attempts=0)
    )
    assert await store.end_attempt(sent["operation_id"], 1, "unknown:timeout", None, "t")
    pages = {}
    async with browser() as session:
        await sign_in(console_gate, session, ADMIN_TOKEN)
        for op in (sent, unsent):
            assert await store.revoke(op["operation_id"], "customer asked", "admin")
            url = f"{console_gate.ops_url}/console/operations/{op['operation_id']}"
            async with session.get(url) as page:
                pages[op["operation_id"]] = await page.text()
    assert "un-sends nothing" in pages[sent["operation_id"]]
    assert "still counts against its budgets" in pages[sent["operation_id"]]
    assert "customer asked" in pages[unsent["operation_id"]]
    assert "un-sends nothing" not in pages[unsent["operation_id"]]
