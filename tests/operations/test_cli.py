"""``opgate ops``: the operations API from a terminal, run as an operator runs it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.killable_opgate import REPO
from tests.support.opgate import ADMIN_TOKEN, Opgate, StartOpgate, fault_policy


async def ops(gate: Opgate, *args: str, token: str = ADMIN_TOKEN) -> tuple[int, str, str]:
    env = {**os.environ, "OPGATE_OPS_URL": gate.ops_url, "OPGATE_ADMIN_TOKEN": token}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "ops",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ops_json(gate: Opgate, *args: str) -> Any:
    code, out, err = await ops(gate, "--json", *args)
    assert code == 0, err
    return json.loads(out)


async def test_create_show_list_and_revoke(fault_gate: Opgate) -> None:
    """An operator approves, inspects, lists and revokes an operation from the command line."""
    created = await ops_json(
        fault_gate,
        "create",
        "--tenant",
        "t1",
        "--provider",
        "fault",
        "--action",
        "refund.create",
        "--amount",
        "700",
        "--currency",
        "usd",
        "--param",
        "charge=ch_9",
        "--approval-ref",
        "T-1",
        "--approved-by",
        "alice",
    )
    operation_id = created["operation_id"]
    assert (created["amount"], created["params"]) == (700, {"charge": "ch_9"})
    code, table, _ = await ops(fault_gate, "list")
    assert code == 0
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["OPERATION_ID", "TENANT", "PROVIDER", "ACTION"]
    assert any(row.startswith(operation_id) and " send " in f" {row} " for row in rows)
    code, shown, _ = await ops(fault_gate, "show", operation_id)
    assert code == 0
    assert "next_action" in shown
    assert "created" in shown
    revoked = await ops_json(fault_gate, "revoke", operation_id, "--reason", "customer asked")
    assert revoked["approval"]["revoked_reason"] == "customer asked"


async def test_reconcile_and_resolve_from_the_command_line(
    fault_gate: Opgate, fault_provider: FaultProvider
) -> None:
    """An unknown outcome with no lookup declared escalates on `reconcile`, shows up in
    `escalations`, and `resolve` settles it with the human's verdict."""
    op = await fault_gate.approve()
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
    status, _, _ = await fault_gate.send(
        "/fault/v1/refunds",
        data="amount=500&currency=usd&charge=ch_1",
        headers={"X-Operation-Id": op["operation_id"]},
    )
    assert status == 502
    view = await ops_json(fault_gate, "reconcile", op["operation_id"])
    assert view["next_action"] == "escalated"
    code, table, _ = await ops(fault_gate, "escalations")
    assert code == 0
    assert op["operation_id"] in table
    resolved = await ops_json(
        fault_gate,
        "resolve",
        op["operation_id"],
        "--verdict",
        "confirmed",
        "--object-id",
        fault_provider.effects[0].id,
        "--note",
        "found in dashboard",
        "--by",
        "bob",
    )
    assert resolved["operation"]["status"] == "confirmed"
    assert resolved["operation"]["resolution_note"] == "found in dashboard"


async def test_errors_are_one_readable_line(fault_gate: Opgate) -> None:
    """A refused call exits 1 with the API's code and sentence; a wrong token is refused."""
    code, _, err = await ops(fault_gate, "show", "op_nope")
    assert (code, err.strip()) == (1, "opgate ops: operation_unknown: no such operation")
    code, _, err = await ops(fault_gate, "list", token="opg_wrong")
    assert code == 1
    assert "admin_unauthenticated" in err


async def test_show_prints_next_action_once_and_the_api_returns_it(fault_gate: Opgate) -> None:
    """`ops show` prints one next_action line, with its value and reason, and
    `GET /v1/operations/{id}` carries the same next_action."""
    op = await fault_gate.approve()
    code, shown, err = await ops(fault_gate, "show", op["operation_id"])
    assert code == 0, err
    assert "5.00 USD (500 minor units)" in shown  # money as a person reads it
    code, listed, err = await ops(fault_gate, "list")
    assert "5.00 USD (500 minor units)" in listed
    lines = [line for line in shown.splitlines() if line.strip().startswith("next_action")]
    assert len(lines) == 1, shown
    assert lines[0].split(None, 1)[1].startswith("send: ")
    row = await fault_gate.operation(op["operation_id"])
    assert row["next_action"] == "send"


async def test_list_shows_who_approved_what_for_which_provider_and_how_long_ago(
    fault_gate: Opgate,
) -> None:
    """The table an on-call human reads: provider, target, approver and age, not only ids."""
    op = await fault_gate.approve()
    code, table, _ = await ops(fault_gate, "list")
    assert code == 0
    header, *rows = table.splitlines()
    for column in ("PROVIDER", "TARGET", "APPROVED_BY", "AGE"):
        assert column in header.split()
    [row] = [r for r in rows if r.startswith(op["operation_id"])]
    assert "fault" in row.split()
    assert "POST /v1/refunds" in row
    assert "alice@example.com" in row
    cells = [c for c in re.split(r"\s{2,}", row) if c]
    assert cells[header.split().index("AGE")].endswith("s")
    assert "5.00 USD (500 minor units)" in cells


async def test_json_is_accepted_after_the_subcommand_too(fault_gate: Opgate) -> None:
    """`opgate ops show ID --json` works as `opgate ops --json show ID` does."""
    op = await fault_gate.approve()
    code, out, err = await ops(fault_gate, "show", op["operation_id"], "--json")
    assert code == 0, err
    assert json.loads(out)["operation_id"] == op["operation_id"]


async def test_budgets_lists_what_is_left_of_each_budget(
    start_opgate: StartOpgate, policy_dir: Path, fault_provider: FaultProvider
) -> None:
    """`opgate ops budgets` prints each budget with its limit, spent and remaining amounts,
    for the tenant asked about even before it spent anything."""
    text = fault_policy(deduplicates=False).replace(
        "rules:\n", "budgets: [{scope: tenant, currency: usd, limit: 1200, window: 24h}]\nrules:\n"
    )
    (policy_dir / "fault.yaml").write_text(text)
    async with start_opgate(upstream_overrides={"fault": fault_provider.url}) as gate:
        code, out, err = await ops(gate, "budgets", "--tenant", "t2")
        listed = await ops_json(gate, "budgets", "--tenant", "t2")
    assert code == 0, err
    head, row = out.splitlines()
    assert head.split() == [
        "PROVIDER", "SCOPE", "TENANT", "AGENT_ID", "CURRENCY", "WINDOW", "LIMIT", "SPENT",
        "REMAINING", "MODE",
    ]  # fmt: skip
    assert [c for c in re.split(r"\s{2,}", row) if c] == [
        "fault", "tenant", "t2", "usd", "24h", "12.00 USD (1200 minor units)",
        "0.00 USD (0 minor units)", "12.00 USD (1200 minor units)", "enforce",
    ]  # fmt: skip
    assert [(b["tenant"], b["remaining"]) for b in listed["budgets"]] == [("t2", 1200)]


async def test_an_id_argument_is_read_by_the_id_grammar_and_sent_as_one_segment(
    fault_gate: Opgate,
) -> None:
    """An operation id no operation can have exits 2 naming the kind, nothing sent; a valid one
    holding / and .. is sent as one path segment and answered as that id (it was pasted into
    the path as it was: the route table's bare 404, another path than the one meant)."""
    await fault_gate.approve(operation_id="op-y")
    code, _, err = await ops(fault_gate, "show", "x/../op-y")
    assert code == 1
    assert "operation_unknown" in err
    code, _, err = await ops(fault_gate, "show", "op \u00e9")
    assert code == 2
    assert "invalid operation id value" in err


async def test_create_with_a_request_key_answers_its_retry_with_the_same_operation(
    fault_gate: Opgate,
) -> None:
    """`ops create --request-key K` sends the approval's own Idempotency-Key: the same command
    again (an operator retrying after a 503) answers the same operation; the key with another
    amount is refused (422 idempotency_key_reused) and approves nothing."""
    approval = ["create", "--tenant", "t1", "--provider", "fault", "--action", "refund.create"]
    approval += ["--currency", "usd", "--param", "charge=ch_9", "--approval-ref", "T-2"]
    approval += ["--approved-by", "alice", "--request-key", 'intent "42"']
    first = await ops_json(fault_gate, *approval, "--amount", "700")
    again = await ops_json(fault_gate, *approval, "--amount", "700")
    assert again["operation_id"] == first["operation_id"]
    code, _, err = await ops(fault_gate, "--json", *approval, "--amount", "900")
    assert code != 0
    assert "idempotency_key_reused" in err
    code, table, _ = await ops(fault_gate, "list")
    assert code == 0
    _header, *rows = table.splitlines()
    assert [row.split()[0] for row in rows if row.strip()] == [first["operation_id"]]
