"""Another tenant's (or another agent's) operation is answered exactly as one that does not
exist, in reverse mode, in forward mode and on the recovery read: a request can learn no id,
key or status outside its scope. Only the audit record says what really happened."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from tests.support.fault_provider import FaultProvider
from tests.support.opgate import (
    AGENT_TOKEN,
    OTHER_TENANT_TOKEN,
    SECOND_AGENT_TOKEN,
    Opgate,
    StartOpgate,
    fault_policy,
)

GOOD_BODY = "amount=500&currency=usd&charge=ch_1"
LOOPBACK_ALLOWED = "forward_proxy:\n  allow_destinations: [loopback]\n"


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes

    def comparable(self, named: str) -> tuple[int, dict[str, str], Any]:
        """Everything the agent sees, with the value it named itself masked (and the Date)."""
        headers = {k: v.replace(named, "<named>") for k, v in self.headers.items() if k != "date"}
        document = json.loads(self.body.decode().replace(named, "<named>"))
        return self.status, headers, document


Send = Callable[[str, dict[str, str]], Awaitable[Answer]]


@dataclass
class Scoped:
    gate: Opgate
    provider: FaultProvider
    modes: dict[str, Send]  # "reverse" / "forward": send a refund as the given agent token


@pytest_asyncio.fixture(loop_scope="session")
async def scoped(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider, tmp_path: Path
) -> AsyncIterator[Scoped]:
    """opgate with the reverse listener and the forward listener (plain-HTTP absolute form)."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False) + LOOPBACK_ALLOWED)
    async with start_opgate(
        forward_listen="127.0.0.1:0",
        ca_dir=tmp_path / "ca",
        upstream_overrides={"fault": fault_provider.url},
    ) as gate:
        forward_url = gate.running.forward_url
        assert forward_url is not None

        async def reverse(token: str, headers: dict[str, str]) -> Answer:
            status, got, body = await gate.send(
                "/fault/v1/refunds", data=GOOD_BODY, headers=headers, token=token
            )
            return Answer(status, {k.lower(): v for k, v in got.items()}, body)

        async def forward(token: str, headers: dict[str, str]) -> Answer:
            proxy = forward_url.replace("http://", f"http://agent:{token}@")
            async with httpx.AsyncClient(proxy=proxy, trust_env=False) as client:
                got = await client.post(
                    f"{fault_provider.url}/v1/refunds",
                    content=GOOD_BODY,
                    headers={**headers, "Content-Type": "application/x-www-form-urlencoded"},
                )
            return Answer(got.status_code, dict(got.headers), got.content)

        yield Scoped(gate, fault_provider, {"reverse": reverse, "forward": forward})


def unknown_like(value: str) -> str:
    """A value of the same length that names nothing (so Content-Length cannot tell)."""
    prefix, _, rest = value.partition("_")
    made = f"{prefix}_{'0' * len(rest)}" if rest else "0" * len(value)
    assert made != value
    return made


def request_records(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry.get("event") == "request" and "decision" in entry]


# scenario: (how the operation is named, approval overrides, the foreign agent's token)
CASES = {
    "other tenant by id": ("X-Operation-Id", {}, OTHER_TENANT_TOKEN),
    "other tenant by key alone": ("Idempotency-Key", {}, OTHER_TENANT_TOKEN),
    "other agent by id": ("X-Operation-Id", {"agent_id": "agent-a"}, SECOND_AGENT_TOKEN),
    "other agent by key alone": ("Idempotency-Key", {"agent_id": "agent-a"}, SECOND_AGENT_TOKEN),
}


@pytest.mark.parametrize("mode", ["reverse", "forward"])
@pytest.mark.parametrize("scenario", list(CASES))
async def test_an_operation_out_of_scope_is_answered_as_an_unknown_one(
    scoped: Scoped, mode: str, scenario: str
) -> None:
    """Naming a confirmed operation of another scope gets, field by field and header by
    header, the answer a never-approved id or key gets; nothing is sent, the row is unchanged,
    and only the audit record says operation_scope_mismatch with the real operation id."""
    header, approval, foreign_token = CASES[scenario]
    send = scoped.modes[mode]
    op = await scoped.gate.approve(**approval)
    owner = await send(AGENT_TOKEN, {"X-Operation-Id": op["operation_id"]})
    assert owner.status == 200  # confirmed: a leak would also hand out the stored answer
    sent_before = len(scoped.provider.requests)
    named = op["operation_id"] if header == "X-Operation-Id" else op["idempotency_key"]
    absent = unknown_like(named)
    with capture_logs() as logs:
        foreign = await send(foreign_token, {header: named})
        unknown = await send(foreign_token, {header: absent})

    assert foreign.comparable(named) == unknown.comparable(absent)
    assert foreign.status in (400, 404)
    told_back = json.dumps(foreign.comparable(named))  # what it named, echoed, is masked
    for secret in (op["operation_id"], op["idempotency_key"], "confirmed"):
        assert secret not in told_back
    assert len(scoped.provider.requests) == sent_before
    row = await scoped.gate.operation(op["operation_id"])
    assert (row["status"], row["attempts"]) == ("confirmed", 1)
    truth, told = request_records(logs)
    assert truth["reason"] == "operation_scope_mismatch"
    assert truth["operation_id"] == op["operation_id"]
    assert truth["response_status"] == told["response_status"] == foreign.status
    assert told["operation_id"] is None
    assert told["reason"] == json.loads(unknown.body)["code"]


async def read(gate: Opgate, path: str, token: str) -> Answer:
    status, headers, body = await gate.send(
        path, method="GET", data=None, content_type=None, token=token
    )
    return Answer(status, {k.lower(): v for k, v in headers.items()}, body)


@pytest.mark.parametrize(
    ("approval", "token"),
    [({}, OTHER_TENANT_TOKEN), ({"agent_id": "agent-a"}, SECOND_AGENT_TOKEN)],
    ids=["other tenant", "other agent"],
)
async def test_the_recovery_read_answers_out_of_scope_as_unknown(
    scoped: Scoped, approval: dict[str, Any], token: str
) -> None:
    """``GET /_opgate/v1/operations/{id}`` of an operation out of scope is the same answer
    as for an id that does not exist, and the list never shows it."""
    op = await scoped.gate.approve(**approval)
    prefix = "/_opgate/v1/operations"
    absent = unknown_like(op["operation_id"])
    foreign = await read(scoped.gate, f"{prefix}/{op['operation_id']}", token)
    unknown = await read(scoped.gate, f"{prefix}/{absent}", token)
    assert foreign.comparable(op["operation_id"]) == unknown.comparable(absent)
    assert foreign.status == 404
    listing = await read(scoped.gate, prefix, token)
    assert listing.status == 200
    listed = [v["operation"]["operation_id"] for v in json.loads(listing.body)["operations"]]
    assert op["operation_id"] not in listed
    owner = await read(scoped.gate, prefix, AGENT_TOKEN)
    assert op["operation_id"] in [
        v["operation"]["operation_id"] for v in json.loads(owner.body)["operations"]
    ]
