"""``opgate proposals ...``: list, approve and decline agents' proposals from a terminal, as
``opgate ops`` does for operations (its HTTP client and tables; ``--json`` for scripts).

    OPGATE_OPS_URL         the operations listener (default: where ``ops_listen`` puts it)
    OPGATE_APPROVER_TOKEN  an approver's token (or OPGATE_ADMIN_TOKEN, the admin's)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from proxy.operations.cli import _age, _call, _cell, _table, money, run_api_call

COLUMNS = (
    "proposal_id",
    "tenant",
    "agent_id",
    "provider",
    "action",
    "target",
    "amount",  # with its currency, as a person reads it (money)
    "age",
    "status",
    "next_action",
    "reason",
)


def add_proposal_commands(commands: Any) -> argparse.ArgumentParser:
    """The ``proposals`` command and its subcommands; returns its parser (the process adds
    ``--dev`` and finds the operations API: proxy/cli.py)."""
    proposals: argparse.ArgumentParser = commands.add_parser(
        "proposals", help="list, approve and decline proposals"
    )
    proposals.add_argument(
        "--url",
        help="the operations API (default: $OPGATE_OPS_URL, else http://<ops_listen setting>)",
    )
    proposals.add_argument(
        "--token",
        default=os.environ.get("OPGATE_APPROVER_TOKEN") or os.environ.get("OPGATE_ADMIN_TOKEN"),
    )
    proposals.add_argument("--json", action="store_true", help="print the API's JSON")
    json_anywhere = argparse.ArgumentParser(add_help=False)
    json_anywhere.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON"
    )
    sub = proposals.add_subparsers(required=True)

    listing = sub.add_parser("list", parents=[json_anywhere], help="proposals (pending first)")
    listing.add_argument(
        "--status",
        default="pending",
        choices=["pending", "expired", "approved", "declined", "withdrawn", "decided", "all"],
    )
    listing.add_argument("--tenant")
    listing.set_defaults(proposals=_list)

    for verdict in ("approve", "decline"):
        decide = sub.add_parser(verdict, parents=[json_anywhere], help=f"{verdict} a proposal")
        decide.add_argument("proposal_id")
        decide.add_argument("--note")
        decide.add_argument(
            "--by", help="who decides (with the admin token; an approver is its token)"
        )
        decide.set_defaults(proposals=_decide, verdict=verdict)

    proposals.set_defaults(handler=run_proposals)
    return proposals


def _list(args: argparse.Namespace) -> Any:
    query = {"status": args.status, **({"tenant": args.tenant} if args.tenant else {})}
    return _call(args, "GET", f"/v1/proposals?{urlencode(query)}")


def _decide(args: argparse.Namespace) -> Any:
    body = {"note": args.note, "decided_by": args.by}
    path = f"/v1/proposals/{quote(args.proposal_id, safe='')}/{args.verdict}"
    return _call(args, "POST", path, {k: v for k, v in body.items() if v is not None})


def run_proposals(args: argparse.Namespace) -> int:
    if not args.token:
        print("opgate proposals: set OPGATE_APPROVER_TOKEN or --token", file=sys.stderr)
        return 1
    return run_api_call(args, "opgate proposals", args.proposals, render)


def _row(view: dict[str, Any], now: datetime) -> dict[str, Any]:
    proposal = view.get("proposal") or {}
    target = proposal.get("target") or {}
    return {
        **proposal,
        "amount": money(proposal.get("amount"), proposal.get("currency")),
        "status": view.get("status"),
        "next_action": view.get("next_action"),
        "target": f"{target.get('method', '')} {target.get('path', '')}".strip(),
        "age": _age(proposal.get("created_at"), now),
    }


def render(result: Any) -> str:
    """A table of proposals; for a decision, what it made (the operation, or the proposal)."""
    now = datetime.now(UTC)
    if isinstance(result, dict) and "proposals" in result:
        rows = [_row(v, now) for v in result["proposals"]]
        return _table(rows, COLUMNS) if rows else "(none)"
    if isinstance(result, dict) and "proposal" in result:
        shown = _row(result, now)
        lines = [f"{k:>12}  {_cell(shown.get(k))}" for k in COLUMNS]
        return "\n".join([*lines, f"{'request':>12}  {json.dumps(result.get('request'))}"])
    if isinstance(result, dict) and "operation" in result:
        op = result["operation"]
        return (
            f"approved: operation {op['operation_id']} ({op['status']}), "
            f"next action {result.get('next_action')}"
        )
    return json.dumps(result, indent=2)
