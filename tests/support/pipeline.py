"""A refund as the pipeline tests send it, and what every agent-facing refusal must meet."""

from __future__ import annotations

from typing import Any

REFUND = "/fault/v1/refunds"


GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


def op_header(op: dict[str, Any]) -> dict[str, str]:
    return {"X-Operation-Id": op["operation_id"]}


# scenario, approval overrides, request overrides, expected status, expected code
REJECTIONS: list[tuple[str, dict[str, Any], dict[str, Any], int, str]] = [
    ("no operation named", {}, {"no_op": True}, 400, "operation_required"),
    (
        "unknown key only",
        {},
        {"no_op": True, "headers": {"Idempotency-Key": "k-x"}},
        400,
        "operation_required",
    ),
    (
        "unknown operation id",
        {},
        {"headers": {"X-Operation-Id": "op_missing"}},
        404,
        "operation_unknown",
    ),
    # Another tenant's or agent's operation: answered as an unknown one (test_scope_oracle.py).
    (
        "approved for another action",
        {},
        {"path": "/fault/v1/refunds/re_1/cancel", "data": ""},
        422,
        "target_mismatch",
    ),
    (
        "other path parameter",
        {
            "action": "refund.cancel",
            "path_params": {"refund": "re_1"},
            "amount": None,
            "currency": None,
            "params": {},
        },
        {"path": "/fault/v1/refunds/re_2/cancel", "data": ""},
        422,
        "target_mismatch",
    ),
    (
        "other idempotency key",
        {},
        {"headers": {"Idempotency-Key": "another"}},
        422,
        "idempotency_key_mismatch",
    ),
    ("other amount", {}, {"data": "amount=5000&currency=usd&charge=ch_1"}, 422, "amount_mismatch"),
    ("amount missing", {}, {"data": "currency=usd&charge=ch_1"}, 422, "amount_mismatch"),
    (
        "amount with a leading zero",
        {},
        {"data": "amount=0500&currency=usd&charge=ch_1"},
        422,
        "amount_mismatch",
    ),
    (
        "other currency",
        {},
        {"data": "amount=500&currency=eur&charge=ch_1"},
        422,
        "currency_mismatch",
    ),
    (
        "other charge",
        {},
        {"data": "amount=500&currency=usd&charge=ch_2"},
        422,
        "parameter_mismatch",
    ),
    ("charge missing", {}, {"data": "amount=500&currency=usd"}, 422, "parameter_mismatch"),
    (
        "unapproved parameter",
        {},
        {"data": GOOD_BODY + "&destination=acct_x"},
        422,
        "parameter_unexpected",
    ),
    (
        "injected field set by the agent",
        {},
        {"data": GOOD_BODY + "&metadata%5Boperation_id%5D=op_other"},
        422,
        "injection_conflict",
    ),
    ("duplicated body key", {}, {"data": GOOD_BODY + "&amount=500"}, 400, "body_invalid"),
    (
        "body that splits on ;",
        {},
        {"data": "amount=500;currency=usd&charge=ch_1"},
        400,
        "body_invalid",
    ),
    (
        "JSON to a form rule",
        {},
        {"data": '{"amount": 500}', "content_type": "application/json"},
        415,
        "content_type_mismatch",
    ),
    ("gzip body", {}, {"headers": {"Content-Encoding": "gzip"}}, 400, "body_invalid"),
    (
        "query string on a mutating call",
        {},
        {"path": REFUND + "?amount=1"},
        400,
        "query_not_allowed",
    ),
    ("oversized body", {}, {"data": GOOD_BODY + "&reason=" + "x" * 70000}, 413, "body_too_large"),
    ("no agent token", {}, {"token": None}, 401, "agent_unauthenticated"),
    ("wrong agent token", {}, {"token": "opg_not_a_real_token"}, 401, "agent_unauthenticated"),
    (
        "provider key instead of agent token",
        {},
        {"token": "sk_live_realkey"},
        401,
        "agent_unauthenticated",
    ),
    ("unrouted path", {}, {"path": "/nowhere/v1/refunds"}, 404, "no_route"),
    ("method no rule allows", {}, {"method": "DELETE", "data": None}, 403, "no_matching_rule"),
]
