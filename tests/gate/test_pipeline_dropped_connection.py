"""A provider that reads a claimed request and then closes opgate's pooled keep-alive
connection: the operation reaches it once, and the outcome stays unknown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.closing_upstream import closing_upstream
from tests.support.opgate import StartOpgate, problem

# PUT and DELETE are the methods an HTTP client treats as safe to re-send by itself.
ITEMS_POLICY = textwrap.dedent("""\
    version: 1
    provider: items
    route_prefix: /items
    upstream: http://127.0.0.1:9
    credential: {header: Authorization, scheme: Bearer, secret: fault_key}
    timeouts: {connect_seconds: 2, total_seconds: 5}
    classify: {confirmed: [2xx], failed: [400, 404], object_id: /id}
    rules:
      - name: item.replace
        method: PUT
        path: /v1/items/{item}
        body: json
        params: [/name]
        inject_metadata: false
      - name: item.delete
        method: DELETE
        path: /v1/items/{item}
        body: none
        inject_metadata: false
      - name: read
        method: GET
        path: /v1/{resource...}
        operation: none
        body: none
    """)

# method, action, params, body
CALLS = [
    ("PUT", "item.replace", {"/name": "x"}, '{"name": "x"}'),
    ("DELETE", "item.delete", {}, None),
]


@pytest.mark.parametrize("stop_listening", [False, True], ids=["listening", "stops-listening"])
@pytest.mark.parametrize(("method", "action", "params", "body"), CALLS, ids=[c[0] for c in CALLS])
async def test_a_claimed_request_read_then_dropped_reaches_the_provider_once(
    start_opgate: StartOpgate,
    policy_dir: Path,
    method: str,
    action: str,
    params: dict[str, str],
    body: str | None,
    stop_listening: bool,
) -> None:
    """The provider read the operation and closed the connection: it received it once, the
    row stays dispatched with unknown:dropped, and the agent is told outcome_unknown."""
    (policy_dir / "items.yaml").write_text(ITEMS_POLICY)
    async with (
        closing_upstream(stop_listening=stop_listening) as provider,
        start_opgate(upstream_overrides={"items": provider.url}) as gate,
    ):
        # a read leaves opgate's egress connection to the provider pooled (keep-alive)
        status, _, _ = await gate.send("/items/v1/items", method="GET", content_type=None)
        assert status == 200
        op = await gate.approve(
            provider="items",
            action=action,
            amount=None,
            currency=None,
            params=params,
            path_params={"item": "it_1"},
        )
        status, headers, answer = await gate.send(
            "/items/v1/items/it_1",
            method=method,
            data=body,
            headers={"X-Operation-Id": op["operation_id"]},
            content_type="application/json",
        )
        row = await gate.operation(op["operation_id"])
    assert provider.methods == ["GET", method], "the provider received the operation twice"
    assert provider.requests[0].connection == provider.requests[1].connection
    assert (status, problem(answer)["code"]) == (502, "outcome_unknown"), answer
    assert headers["X-Operation-Status"] == "dispatched"
    assert (row["status"], row["last_outcome"], row["attempts"]) == (
        "dispatched",
        "unknown:dropped",
        1,
    )
