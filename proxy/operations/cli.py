"""``opgate ops ...``: the operations API from a terminal. Readable tables by default,
``--json`` for scripts. Talks HTTP only (stdlib), so it runs wherever the API is reachable.

    OPGATE_OPS_URL    the operations listener (default: where the ``ops_listen`` setting puts it)
    OPGATE_ADMIN_TOKEN  the admin token (never the digest)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from proxy.gate.ids import IdKind, id_argument
from proxy.policy.amounts import human_amount


def add_ops_commands(commands: Any) -> argparse.ArgumentParser:
    """The ``ops`` command and its subcommands; returns its parser (the process adds ``--dev``)."""
    ops: argparse.ArgumentParser = commands.add_parser(
        "ops", help="create, inspect, reconcile and resolve operations"
    )
    ops.add_argument(
        "--url",
        help="the operations API (default: $OPGATE_OPS_URL, else http://<ops_listen setting>)",
    )
    ops.add_argument("--token", default=os.environ.get("OPGATE_ADMIN_TOKEN"))
    ops.add_argument("--json", action="store_true", help="print the API's JSON")
    # --json after the subcommand too (`opgate ops show ID --json`); SUPPRESS keeps a
    # subcommand that was not given it from resetting the flag given before it.
    json_anywhere = argparse.ArgumentParser(add_help=False)
    json_anywhere.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    sub = ops.add_subparsers(required=True)

    create = sub.add_parser("create", parents=[json_anywhere], help="approve an operation")
    for name in ("tenant", "provider", "action", "approval-ref", "approved-by"):
        create.add_argument(f"--{name}", required=True)
    create.add_argument("--amount", type=int)
    create.add_argument("--currency")
    create.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    create.add_argument("--path-param", action="append", default=[], metavar="NAME=VALUE")
    create.add_argument("--ttl", type=int, default=3600, help="seconds the approval stands")
    create.add_argument("--agent")
    create.add_argument(
        "--idempotency-key",
        type=id_argument(IdKind.IDEMPOTENCY_KEY),
        help="the key the provider will see (opgate makes one when not given)",
    )
    create.add_argument(
        "--request-key",
        help="this approval request's own Idempotency-Key: a retry with the same key (after a"
        " 503 or a lost answer) answers the same operation instead of approving twice",
    )
    create.add_argument("--operation-id", type=id_argument(IdKind.OPERATION))
    create.add_argument("--supersedes", type=id_argument(IdKind.OPERATION))
    create.set_defaults(ops=_create)

    show = sub.add_parser(
        "show", parents=[json_anywhere], help="one operation, with its next action and events"
    )
    show.add_argument("operation_id", type=id_argument(IdKind.OPERATION))
    show.set_defaults(ops=_show)

    listing = sub.add_parser(
        "list", parents=[json_anywhere], help="operations (unsettled by default)"
    )
    listing.add_argument("--status", default="unsettled")
    listing.add_argument("--tenant")
    listing.set_defaults(ops=_list)

    revoke = sub.add_parser(
        "revoke",
        parents=[json_anywhere],
        help="withdraw an unsettled operation's approval: no further attempt; what was sent "
        "stays sent and counted (a settled one: operation_settled)",
    )
    revoke.add_argument("operation_id", type=id_argument(IdKind.OPERATION))
    revoke.add_argument("--reason", required=True)
    revoke.set_defaults(ops=_revoke)

    reconcile = sub.add_parser("reconcile", parents=[json_anywhere], help="ask the provider now")
    reconcile.add_argument("operation_id", type=id_argument(IdKind.OPERATION))
    reconcile.set_defaults(ops=_reconcile)

    escalations = sub.add_parser(
        "escalations", parents=[json_anywhere], help="operations waiting for a human"
    )
    escalations.set_defaults(ops=_escalations)

    resolve = sub.add_parser(
        "resolve", parents=[json_anywhere], help="settle an escalated operation by human verdict"
    )
    resolve.add_argument("operation_id", type=id_argument(IdKind.OPERATION))
    resolve.add_argument("--verdict", choices=["confirmed", "failed"], required=True)
    resolve.add_argument("--object-id", help="the provider's object (for confirmed)")
    resolve.add_argument("--note", required=True)
    resolve.add_argument("--by", required=True, help="who decided")
    resolve.set_defaults(ops=_resolve)

    budgets = sub.add_parser(
        "budgets", parents=[json_anywhere], help="spend budgets and what is left of them"
    )
    budgets.add_argument("--provider")
    budgets.add_argument("--tenant")
    budgets.add_argument("--agent")
    budgets.set_defaults(ops=_budgets)

    ops.set_defaults(handler=run_ops)
    return ops


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status, self.body = status, body


def _call(
    args: argparse.Namespace,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Any:
    if not args.token:
        raise SystemExit("opgate ops: set OPGATE_ADMIN_TOKEN or --token")
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310  (the operator's own configured URL)
        args.url.rstrip("/") + path,
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {args.token}",
            "Content-Type": "application/json",
            **(headers or {}),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw.decode(errors="replace")
        raise ApiError(exc.code, payload) from exc


def _quoted(operation_id: str) -> str:
    """An id as one path segment: a valid id may hold / ? # or %."""
    return urllib.parse.quote(operation_id, safe="")


def _pairs(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"opgate ops: expected NAME=VALUE, got {item!r}")
        out[name] = value
    return out


def _create(args: argparse.Namespace) -> Any:
    body = {
        "tenant": args.tenant,
        "provider": args.provider,
        "action": args.action,
        "amount": args.amount,
        "currency": args.currency,
        "params": _pairs(args.param),
        "path_params": _pairs(args.path_param),
        "approval_ref": args.approval_ref,
        "approved_by": args.approved_by,
        "ttl_seconds": args.ttl,
        "agent_id": args.agent,
        "idempotency_key": args.idempotency_key,
        "operation_id": args.operation_id,
        "supersedes": args.supersedes,
    }
    retry_key = None
    if args.request_key is not None:  # as an RFC 8941 string, the header's form in the draft
        quoted = args.request_key.replace("\\", "\\\\").replace('"', '\\"')
        retry_key = {"Idempotency-Key": f'"{quoted}"'}
    return _call(
        args,
        "POST",
        "/v1/operations",
        {k: v for k, v in body.items() if v is not None},
        headers=retry_key,
    )


def _show(args: argparse.Namespace) -> Any:
    return _call(args, "GET", f"/v1/operations/{_quoted(args.operation_id)}")


def _list(args: argparse.Namespace) -> Any:
    query = f"?status={args.status}" + (f"&tenant={args.tenant}" if args.tenant else "")
    return _call(args, "GET", f"/v1/operations{query}")


def _revoke(args: argparse.Namespace) -> Any:
    return _call(
        args, "POST", f"/v1/operations/{_quoted(args.operation_id)}/revoke", {"reason": args.reason}
    )


def _reconcile(args: argparse.Namespace) -> Any:
    return _call(args, "POST", f"/v1/operations/{_quoted(args.operation_id)}/reconcile", {})


def _escalations(args: argparse.Namespace) -> Any:
    return _call(args, "GET", "/v1/escalations")


def _resolve(args: argparse.Namespace) -> Any:
    body = {
        "verdict": args.verdict,
        "object_id": args.object_id,
        "note": args.note,
        "decided_by": args.by,
    }
    return _call(args, "POST", f"/v1/operations/{_quoted(args.operation_id)}/resolve", body)


def _budgets(args: argparse.Namespace) -> Any:
    wanted = {"provider": args.provider, "tenant": args.tenant, "agent_id": args.agent}
    query = urllib.parse.urlencode({k: v for k, v in wanted.items() if v})
    return _call(args, "GET", "/v1/budgets" + (f"?{query}" if query else ""))


def run_ops(args: argparse.Namespace) -> int:
    return run_api_call(args, "opgate ops", args.ops, render)


def run_api_call(
    args: argparse.Namespace,
    command: str,
    call: Callable[[argparse.Namespace], Any],
    table: Callable[[Any], str],
) -> int:
    """One call of an operations API command: its answer printed (a table, or JSON with
    --json), or the API's code and sentence (or why opgate cannot be reached) on stderr."""
    try:
        result = call(args)
    except ApiError as exc:
        detail = exc.body.get("detail") if isinstance(exc.body, dict) else exc.body
        code = exc.body.get("code") if isinstance(exc.body, dict) else exc.status
        print(f"{command}: {code}: {detail}", file=sys.stderr)
        return 1
    except urllib.error.URLError as exc:
        print(f"{command}: cannot reach {args.url}: {exc.reason}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


COLUMNS = (
    "operation_id",
    "tenant",
    "provider",
    "action",
    "target",
    "amount",  # with its currency, as a person reads it (money)
    "approved_by",
    "age",
    "status",
    "next_action",
    "attempts",
)
BUDGET_COLUMNS = (
    "provider",
    "scope",
    "tenant",
    "agent_id",
    "currency",
    "window",
    "limit",
    "spent",
    "remaining",
    "mode",
)
# An escalation's table says why and since when as well.
ESCALATION_COLUMNS = (*COLUMNS, "escalated_since", "escalation_reason")


def _row(item: dict[str, Any], now: datetime) -> dict[str, Any]:
    op = item.get("operation", item)
    target = op.get("target") or {}
    escalation = op.get("escalation") or {}
    return {
        **op,
        "amount": money(op.get("amount"), op.get("currency")),
        "next_action": item.get("next_action", ""),
        "target": f"{target.get('method', '')} {target.get('path', '')}".strip(),
        "approved_by": (op.get("approval") or {}).get("approved_by"),
        "age": _age(op.get("created_at"), now),
        "escalated_since": escalation.get("since"),
        "escalation_reason": escalation.get("reason"),
    }


def money(minor_units: Any, currency: Any) -> str | None:
    """An amount as every table shows it to a person: "6.00 USD (600 minor units)"
    (``human_amount``); None where there is no amount."""
    if not isinstance(minor_units, int) or isinstance(minor_units, bool):
        return None
    code = currency if isinstance(currency, str) else None
    return human_amount(minor_units, code, with_minor_units=True)


def _budget_row(budget: dict[str, Any]) -> dict[str, Any]:
    amounts = {k: money(budget.get(k), budget.get("currency")) for k in ("limit", "spent")}
    return {
        **budget,
        **amounts,
        "remaining": money(budget.get("remaining"), budget.get("currency")),
    }


def _age(created_at: str | None, now: datetime) -> str:
    if not created_at:
        return ""
    seconds = int((now - datetime.fromisoformat(created_at)).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def render(result: Any) -> str:
    """A readable table for lists, a key/value block for one operation."""
    if isinstance(result, dict) and "budgets" in result:
        budgets: list[dict[str, Any]] = result["budgets"]
        rows = [_budget_row(b) for b in budgets]
        return _table(rows, BUDGET_COLUMNS) if rows else "(none)"
    if isinstance(result, dict) and ("operations" in result or "escalations" in result):
        items: list[dict[str, Any]] = result.get("operations") or result.get("escalations") or []
        now = datetime.now(UTC)
        rows = [_row(i, now) for i in items]
        columns = ESCALATION_COLUMNS if "escalations" in result else COLUMNS
        return _table(rows, columns) if rows else "(none)"
    if isinstance(result, dict):
        op = result.get("operation", result)
        # next_action is the view's, not the row's: printed once, with its reason, below
        shown = _row(result, datetime.now(UTC))
        lines = [f"{k:>16}  {_cell(shown.get(k))}" for k in COLUMNS if k != "next_action"]
        if "next_action" in result:
            lines.append(
                f"{'next_action':>16}  {result['next_action']}: {result.get('reason', '')}"
            )
        lines.append(f"{'idempotency_key':>16}  {op.get('idempotency_key')}")
        if op.get("escalation"):
            lines.append(
                f"{'escalated':>16}  {op['escalation']['since']}: {op['escalation']['reason']}"
            )
        if op.get("provider_response"):
            response = op["provider_response"]
            lines.append(f"{'provider':>16}  {response['status']} {response['object_id'] or ''}")
        for event in result.get("events", op.get("events", [])) or []:
            lines.append(f"{'event':>16}  {event['at']}  {event['event']}  {event['actor']}")
        return "\n".join(lines)
    return json.dumps(result, indent=2)


def _cell(value: Any) -> str:
    return "" if value is None else str(value)


def _table(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    widths = {c: max(len(c), *(len(_cell(r.get(c))) for r in rows)) for c in columns}
    head = "  ".join(c.upper().ljust(widths[c]) for c in columns)
    body = ["  ".join(_cell(r.get(c)).ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join([head, *body])
