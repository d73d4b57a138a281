"""A query string on a call that takes an operation: refused before anything reaches the provider,
whatever the rule's body kind, in reverse and in forward (HTTP_PROXY) mode; and the audit record
binds the whole target the agent sent (the path, and the query's SHA-256)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
from structlog.testing import capture_logs

from proxy.gate.intake import takes_no_query
from proxy.policy.load import load_policy_dir
from tests.support.audit_logs import audits
from tests.support.fake_square import FakeSquare
from tests.support.fault_provider import FaultProvider
from tests.support.forward import LOOPBACK_ALLOWED
from tests.support.opgate import (
    AGENT_TOKEN,
    SHIPPED_POLICIES,
    Opgate,
    StartOpgate,
    fault_policy,
    problem,
)
from tests.support.sdk_gates import square, square_gate  # noqa: F401

CANCEL = "/v1/refunds/re_1/cancel"
SMUGGLED = "?amount=999999&final_capture=false"


def sha256(query: str) -> str:
    """The digest the record keeps of ``?query`` (the query without its ``?``)."""
    return hashlib.sha256(query.removeprefix("?").encode()).hexdigest()


def bodiless_cancel_policy() -> str:
    """The fault provider's policy with its cancel rule taking no body (as PayPal's
    order.capture and Square's payment.cancel do)."""
    policy = fault_policy(deduplicates=False)
    form_cancel = "path: /v1/refunds/{refund}/cancel\n    body: form"
    assert form_cancel in policy
    return policy.replace(form_cancel, "path: /v1/refunds/{refund}/cancel\n    body: none")


async def approve_cancel(gate: Opgate) -> dict[str, Any]:
    return await gate.approve(
        action="refund.cancel",
        amount=None,
        currency=None,
        params={},
        path_params={"refund": "re_1"},
    )


async def test_a_query_on_a_bodiless_operation_is_refused_in_reverse_mode(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """POST .../cancel?amount=... on a `body: none` rule is refused 400 query_not_allowed,
    nothing reaches the provider, the operation stays created, and the record binds the query;
    the same call without a query then goes out once."""
    (policy_dir / "fault.yaml").write_text(bodiless_cancel_policy())
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        op = await approve_cancel(gate)
        named = {"X-Operation-Id": op["operation_id"]}
        with capture_logs() as logs:
            status, _, body = await gate.send(
                f"/fault{CANCEL}{SMUGGLED}", data=None, headers=named, content_type=None
            )
        assert (status, problem(body).get("code")) == (400, "query_not_allowed")
        assert fault_provider.requests == []
        assert (await gate.operation(op["operation_id"]))["status"] == "created"
        [record] = audits(logs)
        assert (record["reason"], record["path"], record["query_sha256"]) == (
            "query_not_allowed",
            f"/fault{CANCEL}",
            sha256(SMUGGLED),
        )
        status, _, _ = await gate.send(
            f"/fault{CANCEL}", data=None, headers=named, content_type=None
        )
        assert status == 200
        [sent] = fault_provider.requests
        assert (sent.path, sent.query_string) == (CANCEL, "")


async def test_a_query_on_a_bodiless_operation_is_refused_in_forward_mode(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> None:
    """Through HTTP_PROXY (absolute-form), the same query is refused the same way and
    audited with the path and the query's digest; nothing reaches the provider."""
    (policy_dir / "fault.yaml").write_text(bodiless_cancel_policy() + LOOPBACK_ALLOWED)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
    ) as gate:
        assert gate.running.forward_url is not None
        proxy = gate.running.forward_url.replace("http://", f"http://agent:{AGENT_TOKEN}@")
        op = await approve_cancel(gate)
        named = {"X-Operation-Id": op["operation_id"]}
        with capture_logs() as logs:
            async with httpx.AsyncClient(proxy=proxy, trust_env=False) as client:
                refused = await client.post(
                    f"{fault_provider.url}{CANCEL}{SMUGGLED}", headers=named
                )
        assert (refused.status_code, problem(refused.content).get("code")) == (
            400,
            "query_not_allowed",
        )
        assert fault_provider.requests == []
        [record] = audits(logs)
        assert (record["listener"], record["path"], record["query_sha256"]) == (
            "forward",
            CANCEL,
            sha256(SMUGGLED),
        )
        assert (await gate.operation(op["operation_id"]))["status"] == "created"


async def test_a_query_on_a_form_operation_is_refused_and_a_read_keeps_its_query(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """A body-carrying operation refuses a query as before; a read (no operation) forwards its
    query, and its record keeps the query's digest, not its values."""
    op = await fault_gate.approve()
    status, _, body = await fault_gate.send(
        "/fault/v1/refunds?amount=999999",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert (status, problem(body).get("code")) == (400, "query_not_allowed")
    with capture_logs() as logs:
        status, _, _ = await fault_gate.send(
            "/fault/v1/refunds?limit=3", method="GET", data=None, content_type=None
        )
    assert status == 200
    [read] = fault_provider.requests
    assert read.query_string == "limit=3"
    [record] = audits(logs)
    assert (record["path"], record["query_sha256"]) == ("/fault/v1/refunds", sha256("?limit=3"))
    assert "limit=3" not in json.dumps(record)  # the query's values stay out of the record


async def test_the_shipped_square_cancel_refuses_a_query(
    square_gate: Opgate,  # noqa: F811
    square: FakeSquare,  # noqa: F811
) -> None:
    """The shipped Square policy's `payment.cancel` (body: none): a query is refused and the
    fake Square receives nothing."""
    op = await square_gate.approve(
        provider="square",
        action="payment.cancel",
        amount=None,
        currency=None,
        params={},
        path_params={"payment": "pay_1"},
    )
    status, _, _ = await square_gate.send(
        "/square/v2/payments/pay_1/cancel?amount_money=999999",
        data=None,
        headers={"X-Operation-Id": op["operation_id"]},
        content_type=None,
    )
    assert status == 400
    assert square.posts() == []
    assert (await square_gate.operation(op["operation_id"]))["status"] == "created"


def test_no_shipped_rule_forwards_a_query_on_a_call_that_changes_anything() -> None:
    """Every shipped rule either refuses a query or is a read (GET/HEAD) without an operation:
    no query can carry a parameter past an approval."""
    policy = load_policy_dir(SHIPPED_POLICIES)
    forwarding = [
        (provider.provider, rule.name, rule.method)
        for provider in policy.providers
        for rule in provider.rules
        if not takes_no_query(rule)
    ]
    assert forwarding
    assert all(method in ("GET", "HEAD") for _, _, method in forwarding), forwarding
