"""An approval's fields are defined once (proxy/store/operation.py ``Approval``): the rows derive
from it, and every copy that must restate them is checked against it here: the statements that
write them, the tables, the operations API's request model, the public shapes, the documented
request; and the claim's parameters (``store.Claim``) against its statement."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import proxy.store
from proxy.operations.approvals import FROM_THE_RULE, REPEATED_FIELDS, OperationRequest
from proxy.proposals.rules import ProposalRequest
from proxy.store.operation import Approval, Approved, Operation
from proxy.store.proposal import Proposal
from proxy.store.queries import QUERIES
from proxy.store.store import Claim, NewOperation
from tests.support.operations import NOW, new_operation, operation
from tests.support.paths import REPO

APPROVAL = [f.name for f in fields(Approval)]
APPROVED = [f.name for f in fields(Approved)]
SCHEMA = (Path(proxy.store.__file__).parent / "schema.sql").read_text()


def _names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]


def _columns(table: str) -> set[str]:
    body = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", SCHEMA, re.DOTALL)
    assert body is not None, table
    return {line.split()[0] for line in body.group(1).splitlines() if line.strip()}


def test_the_rows_are_the_approval_with_more() -> None:
    """The row to insert, the operation row and a proposal carry the approval's fields, by
    its names and types (a proposal's agent_id is required), the approval's first."""
    assert _names(NewOperation)[: len(APPROVED)] == APPROVED
    assert _names(Operation)[: len(APPROVED)] == APPROVED
    assert _names(Proposal)[: len(APPROVAL)] == APPROVAL
    assert all(issubclass(c, Approval) for c in (NewOperation, Operation, Proposal))


def test_the_statements_and_tables_hold_every_field() -> None:
    """The statements that write an approval take each of its fields as a parameter of the
    same name, and the tables have a column of that name."""
    for name in ("create_operation", "create_operation_keyed"):
        assert set(_names(NewOperation)) <= set(QUERIES[name].parameters), name
    assert set(APPROVAL) <= set(QUERIES["proposal_create"].parameters)
    assert set(_names(NewOperation)) <= _columns("operations")
    assert set(APPROVAL) <= _columns("proposals")


def test_the_claim_is_its_statements_parameters() -> None:
    """``Claim``'s fields are exactly queries.sql ``claim_operation``'s parameters."""
    assert set(_names(Claim)) == set(QUERIES["claim_operation"].parameters)


def test_the_api_requests_name_the_approval() -> None:
    """``POST /v1/operations`` takes each field of the row to insert but those the rule gives,
    and a ttl instead of an expiry; an agent's proposal takes a part of it, and its reason."""
    taken = set(OperationRequest.model_fields)
    assert taken == set(_names(NewOperation)) - FROM_THE_RULE | {"ttl_seconds"}
    assert set(ProposalRequest.model_fields) <= taken | {"reason"}
    assert set(REPEATED_FIELDS) <= set(APPROVED)


def test_the_public_shapes_show_every_field() -> None:
    """An operation's public shape shows each approval field (the target and the approval as
    objects); a proposal's each but the key."""
    shown = operation().to_public()
    flat = set(shown) | {f"target.{k}" for k in shown["target"]}
    flat |= {f"approval.{k}" for k in shown["approval"]}
    spelt = {"method": "target.method", "path": "target.path", "path_params": "target.path_params"}
    spelt |= {"approval_ref": "approval.ref", "approved_by": "approval.approved_by"}
    spelt |= {"expires_at": "approval.expires_at"}
    assert {spelt.get(name, name) for name in APPROVED} <= flat
    op = new_operation("op_1")
    proposal = Proposal(
        **{name: getattr(op, name) for name in APPROVAL} | {"agent_id": "a1"},
        proposal_id="prop_1",
        reason="why",
        approval_seconds=60.0,
        status="pending",
        expires_at=NOW,
        decided_at=None,
        decided_by=None,
        decision_note=None,
        created_at=NOW,
        read_at=NOW,
    )
    proposed = proposal.to_public()
    flat = set(proposed) | {f"target.{k}" for k in proposed["target"]}
    assert {spelt.get(name, name) for name in APPROVAL} - flat == {"idempotency_key"}


def test_the_documented_request_names_every_field() -> None:
    """docs/reference/operations-api.md's ``POST /v1/operations`` row names every field the
    request takes."""
    text = (REPO / "docs" / "reference" / "operations-api.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `POST /v1/operations` |"))
    named = set(re.findall(r"`([a-z_]+)`", row))
    assert set(OperationRequest.model_fields) - named == set()


def test_the_documented_created_event_names_every_field() -> None:
    """docs/audit.md's ``detail`` of a ``created`` event names every field of the approval as
    given (the key as its SHA-256; the operation id is the record's stream)."""
    text = (REPO / "docs" / "audit.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `detail` | on `created`"))
    named = set(re.findall(r"`([a-z_0-9]+)`", row.split("; otherwise")[0]))
    spelt = {"idempotency_key": "idempotency_key_sha256"}
    given = {spelt.get(n, n) for n in _names(NewOperation) if n != "operation_id"}
    assert given - named == set()
