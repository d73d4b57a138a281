"""The reference pages that restate code, written from it: ``docs/reference/codes.md`` from
``Reason`` and ``REASONS`` (proxy/gate/reasons.py), ``docs/reference/settings.md`` from
``Settings`` (proxy/settings.py) and ``docs/reference/cli.md`` from the command line's parsers.

A test (tests/authoring/test_reference.py) fails when a committed page differs from what this
module writes now. Refresh them with ``python docs/generate.py``: that script hands the command
line's parser in, since the process (proxy/cli.py) sits above this package.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic_core import PydanticUndefined

from proxy.gate.reasons import REASONS, Reason
from proxy.settings import Settings

REFRESH = "python docs/generate.py"
HEADER = "<!-- Written by {refresh} from {source}: do not edit by hand. -->\n\n"

# What each code means, beyond its title: kept here, beside the table it fills.
MEANINGS: dict[Reason, str] = {
    Reason.NO_ROUTE: (
        "No provider is configured for this path. Use a route prefix from opgate's policies."
    ),
    Reason.NO_MATCHING_RULE: "No policy rule allows this request (deny by default).",
    Reason.AGENT_UNAUTHENTICATED: "No valid agent token.",
    Reason.AMBIGUOUS_REQUEST: (
        "A header that must be single is sent twice, or two different credentials are presented."
    ),
    Reason.PATH_NOT_CANONICAL: "Percent-escapes, dot segments or empty segments in the path.",
    Reason.REQUEST_MALFORMED: (
        "HTTP framing opgate will not guess at (two `Content-Length`s, `Transfer-Encoding` with"
        " `Content-Length`, a bad request line), or a body cut short by the agent hanging up "
        "(then only audited: nobody is left to answer)."
    ),
    Reason.HEADER_INVALID: (
        "A header value is not printable ASCII (a NUL, a control character, invalid UTF-8, any "
        "non-ASCII byte), or the idempotency key is not 1-255 printable ASCII characters."
    ),
    Reason.OPERATION_ID_INVALID: (
        "An operation id (in a path, a header, a body or a tool's arguments) that is not "
        "printable ASCII of at most 255 characters (proxy/gate/ids.py)."
    ),
    Reason.OPERATION_ID_RESERVED: (
        "Operations API: an approval names its new operation with a prefix opgate mints for "
        "another kind of id (`prop_`: a proposal; `ap2_`: a mandate's operation), so a reader of "
        "the id (an MCP task id, a console link) could take it for that kind. Nothing is created."
    ),
    Reason.PROXY_AUTH_REQUIRED: (
        "Forward mode: no valid agent token in `Proxy-Authorization` (answered with "
        "`Proxy-Authenticate`)."
    ),
    Reason.PROXY_REQUEST_INVALID: (
        "Forward mode: neither `CONNECT host:port` nor an absolute-form request."
    ),
    Reason.HOST_NOT_ALLOWED: "Forward mode: no policy names this host (or its scheme/port).",
    Reason.DESTINATION_NOT_ALLOWED: (
        "Forward mode: the host resolves to a loopback, private, link-local or metadata address"
        " no policy allows."
    ),
    Reason.MISDIRECTED_REQUEST: (
        "Forward mode: the `Host` header, the TLS SNI and the CONNECT target (or absolute URI) "
        "disagree."
    ),
    Reason.BODY_TOO_LARGE: "Larger than the provider's `max_request_body_bytes`.",
    Reason.BODY_INVALID: (
        "The body does not parse one way only (duplicate key, bad escape, NaN, "
        "`Content-Encoding`...), or could not leave as written: JSON nested deeper than 64 "
        "levels, a number its double would rewrite (`1e400`)."
    ),
    Reason.CONTENT_TYPE_MISMATCH: "The content type disagrees with the rule's body kind.",
    Reason.EXPECTATION_UNSUPPORTED: (
        "An `Expect` other than `100-continue` (RFC 9110 10.1.1). `100 Continue` itself is "
        "sent only once the agent, the rule (in forward mode the proxy token and the host too) "
        "and the declared length have passed."
    ),
    Reason.QUERY_NOT_ALLOWED: (
        "A call that takes an operation or a body carries its parameters in the path and the "
        "validated body only (`body: none` too): only reads without an operation forward a query."
    ),
    Reason.BODY_TIMEOUT: "The whole body did not arrive within `body_read_timeout_seconds`.",
    Reason.OPERATION_REQUIRED: "The rule needs an approved operation and none is named.",
    Reason.OPERATION_UNKNOWN: (
        "`X-Operation-Id` names no operation, or one outside the agent's scope (see the next row)."
    ),
    Reason.OPERATION_SCOPE_MISMATCH: (
        "The operation belongs to another tenant or agent. Never answered: the agent gets "
        "exactly the answer for an operation that does not exist (404 `operation_unknown` by "
        "id, 400 `operation_required` by key alone; same body fields, same headers, no id or "
        "status), in both modes and on the recovery read. The audit record keeps this code and "
        "the operation id (docs/audit.md)."
    ),
    Reason.TARGET_MISMATCH: (
        "Another provider, rule, method or path (path parameters included) than approved."
    ),
    Reason.IDEMPOTENCY_KEY_MISMATCH: "Another idempotency key than the approved one.",
    Reason.AMOUNT_MISMATCH: (
        "Another amount, or one written non-canonically (`0500`), or present/absent unlike the "
        "approval."
    ),
    Reason.CURRENCY_MISMATCH: (
        "Another currency (compared as ASCII letters, case aside: the Kelvin sign is no `k`)."
    ),
    Reason.PARAMETER_MISMATCH: (
        "An approved parameter differs, is missing, or an unapproved one of the rule's `params`"
        " is set."
    ),
    Reason.PARAMETER_UNEXPECTED: "A field neither approved nor listed as `free` by the rule.",
    Reason.INJECTION_CONFLICT: (
        "The agent set the field opgate injects (`metadata[operation_id]`) to another value, or"
        " sent a key a bracket parser could read as it (`metadata[operation_id][x]`, "
        "`metadata.operation_id`)."
    ),
    Reason.APPROVAL_REVOKED: "The approval was revoked. Nothing is un-sent by revoking.",
    Reason.APPROVAL_EXPIRED: "The approval has expired.",
    Reason.OPERATION_IN_FLIGHT: "An attempt is in flight; `Retry-After` says when to ask again.",
    Reason.CLAIM_REFUSED: (
        "The claim statement claimed nothing on a row that, read again, may be sent: nothing was"
        " sent, and opgate logs `claim_refused` with the row's transition."
    ),
    Reason.DECISION_STALE: (
        "The claim commits only the decision made on the row as read: another writer moved the"
        " row since (a lookup, a reconciliation), or the decision outlived its deadline (the"
        " approval's expiry, an attempt's lease). Nothing was sent."
    ),
    Reason.OPERATION_FAILED: (
        "The provider refused the operation; its answer is attached. A new attempt needs a new "
        "approval."
    ),
    Reason.RECONCILE_REQUIRED: (
        "The last outcome is unknown and the provider does not deduplicate: do not re-send."
    ),
    Reason.OPERATION_ESCALATED: (
        "A human must decide this operation's outcome; nothing is sent until then."
    ),
    Reason.PROPOSAL_INVALID: (
        "`POST /_opgate/v1/proposals`: the body is not a proposal (an unknown or missing field,"
        " a `tenant` or `agent_id`, which are the token's, a string amount, an empty or "
        "over-long `reason`); `errors` lists every problem. Nothing was proposed."
    ),
    Reason.APPROVAL_NOT_SENDABLE: (
        "The proposed approval could never be sent as one well-formed request (as for an "
        "operations API approval: a parameter the rule does not compare, a missing path "
        "parameter, a body over the provider's limit...). Nothing was proposed."
    ),
    Reason.IDEMPOTENCY_KEY_REUSED: (
        "`POST /v1/operations`: the `Idempotency-Key` (IETF httpapi draft) already made an "
        "operation of this tenant from another approval (its body differs). The same key with "
        "the same body answers that operation again (200), however many times it is retried."
    ),
    Reason.MANDATES_NOT_SUPPORTED: "No mandate issuer is configured (`mandate_issuers`).",
    Reason.MANDATE_INVALID: (
        "The presented mandate fails a verification step (signature, disclosures, key binding, "
        "AP2 fields); the detail names the step. AP2 error `invalid_credential`."
    ),
    Reason.MANDATE_EXPIRED: "The mandate (or the agent's closed one) is past its `exp`.",
    Reason.MANDATE_ISSUER_UNKNOWN: (
        "The mandate is signed under a key no issuer trusted for the agent's tenant holds."
    ),
    Reason.MANDATE_MISMATCH: (
        "The call differs from what the person approved (`field` names it: the payee's "
        "provider, a value the open mandate fixed). AP2 error `invalid_mandate`."
    ),
    Reason.MANDATE_CONSTRAINT_FAILED: (
        "A constraint of the open mandate fails, or cannot be evaluated (`constraint` names "
        "it; `unknown` for a type opgate does not know). AP2 error `unresolved_constraint`."
    ),
    Reason.MANDATE_EXHAUSTED: (
        "The open mandate's uses (`payment.agent_recurrence`, one without it) or its "
        "`payment.budget` are spent, counted across every opgate process."
    ),
    Reason.MANDATE_REVOKED: "The mandate (or its open mandate) was revoked by its digest.",
    Reason.MANDATE_NONCE_UNKNOWN: (
        "A key binding's `nonce` is not one opgate issued to this agent of this tenant "
        "(`POST /_opgate/v1/mandates/nonces`), or it expired. AP2 error `invalid_credential`."
    ),
    Reason.AGENT_SIGNING_KEY_MISSING: (
        "The provider's policy sets `agent_signature` (RFC 9421) and the agent has no "
        "`signing_key_file`: nothing is sent unsigned."
    ),
    Reason.MANDATE_NONCE_USED: (
        "A key binding's `nonce` already answered another mandate's presentation (a replay). "
        "AP2 error `invalid_credential`."
    ),
    Reason.MANDATE_RECEIPT_INVALID: (
        "`POST /_opgate/v1/mandates/receipts` with a receipt that does not verify under "
        "opgate's own receipt key (`kid`, ES256, `iss` = `mandate_audience`), or an error "
        "receipt naming no operation."
    ),
    Reason.PROPOSAL_UNKNOWN: (
        "No such proposal, or one of another tenant or agent (the same answer; on record "
        "`operation_scope_mismatch`)."
    ),
    Reason.PROPOSAL_NOT_WITHDRAWABLE: (
        "`POST /_opgate/v1/proposals/{id}/withdraw` of the agent's own proposal that is no "
        "longer pending: approved (its operation exists), declined, expired, or withdrawn "
        "already. Only a pending proposal is withdrawn, in one conditional statement, so a "
        "withdrawal never races an approval."
    ),
    Reason.X402_CHALLENGE_INVALID: (
        "The provider answered 402 with a PAYMENT-REQUIRED that is not a well-formed x402 v2 "
        "challenge (base64 JSON, bounded size and depth, uint256 amounts): nothing was signed "
        "(docs/x402.md)."
    ),
    Reason.X402_NOT_APPROVED: (
        "No requirement of the provider's 402 fits the operation's approved payment terms and "
        "the rule's networks, assets and schemes; the detail names the term each breaks. "
        "Nothing was signed (docs/x402.md)."
    ),
    Reason.X402_PAYMENT_REFUSED: (
        "The provider answered the operation's one payment with another 402, not saying its "
        "nonce is used; the payment's evidence is attached. opgate never signs a second "
        "payment for the operation (docs/x402.md)."
    ),
    Reason.X402_PAID_ANSWER_LOST: (
        "The provider refused the operation's stored payment because its nonce is used, or "
        "reconciliation read the nonce used on the chain: the operation was paid and its answer "
        "lost. It is settled confirmed with this answer and the payment's evidence (digest, "
        "nonce, payer, payTo, amount); nothing is signed again. Where the provider declared "
        "the payment-identifier extension, reconciliation first sends the stored payment again "
        "and settles with the answer the provider kept under its id (settled_reason "
        "`x402_answer_recovered`) instead (docs/x402.md)."
    ),
    Reason.X402_PAYMENT_INVALID: (
        "The agent's own PAYMENT-SIGNATURE (rule `x402.payer: agent`) is not an x402 v2 exact "
        "EIP-3009 payment signed by its payer: nothing was sent (docs/x402.md)."
    ),
    Reason.PAYMENT_AUTHORIZATION_MISMATCH: (
        "The agent sent another payment authorization than the one bound to the operation (its "
        "first, by nonce): nothing was sent; the bound one's digest and nonce are attached."
    ),
    Reason.X402_BUDGET_EXCEEDED: (
        "Keeping the operation's payment would take its tenant's or agent's x402 payments over "
        "a budget (the asset's atomic units, across payees and providers) or a payment rate "
        "limit of the policy's payments file: nothing was kept or sent, whoever signs; the "
        "limit and what was paid in its window are attached (`limit`). The attempt ends as "
        "never sent: the operation may pay once the window has room."
    ),
    Reason.X402_MANDATE_BUDGET_EXCEEDED: (
        "Keeping the payment of an operation made under an AP2 open mandate would take the "
        "payments kept under that mandate (across its payees, whoever signs) past its "
        "`payment.budget`, summed through the payments file's pegs under the mandate's lock; or "
        "a payment's asset has no peg to the mandate's currency, or the mandate's budget was "
        "never recorded: nothing was kept or sent (docs/x402.md)."
    ),
    Reason.PRECONDITION_FAILED: (
        "The rule's preconditions (a lookup at the provider before the send) no longer hold: "
        "the lookup's evidence is attached, nothing was sent, the row stays `created` and the "
        "recovery read says `new_approval_required`."
    ),
    Reason.PRECONDITION_UNVERIFIABLE: (
        "The precondition lookup failed or timed out, or its answer could not be evaluated. "
        "Nothing was sent; the same request may be sent again later."
    ),
    Reason.AGENT_CONCURRENCY_EXCEEDED: (
        "The agent already has `max_requests_in_flight_per_agent` requests in flight; "
        "`Retry-After` says when to try again. Nothing was sent."
    ),
    Reason.RATE_LIMITED: (
        "Over a request rate or an in-flight cap per agent or per tenant (see [Rate "
        "limits](policy-format.md#rate-limits)); `Retry-After` says when a request would be "
        "admitted. Nothing was sent, the body was not read."
    ),
    Reason.BUDGET_EXCEEDED: (
        "The operation would take a spend budget over its limit in its window (see "
        "[Budgets](policy-format.md#budgets)); the body's `budget` member says which one "
        "(`scope`, `tenant`, `agent_id`, `currency`, `limit`, `window`, `spent`, `remaining`, "
        "`amount`). Nothing was sent; no retry will help until the window frees enough. Also "
        "answered by `POST /v1/operations` (advisory)."
    ),
    Reason.STORE_UNAVAILABLE: (
        "The database cannot be reached or used: a refused connection or login, a read-only "
        "server (a standby), a timeout. Nothing was sent. Every listener answers it so (never a"
        " 500), and `/readyz` is 503. An approval (`POST /v1/operations`) answered 503 may "
        "still have been created (its commit's answer lost): retry it with the same "
        "`Idempotency-Key`."
    ),
    Reason.CREDENTIAL_UNAVAILABLE: "No provider credential configured. Nothing was sent.",
    Reason.OUTCOME_UNKNOWN: (
        "Sent (perhaps) but no conclusive answer: the row stays `dispatched`. Ask, do not re-plan."
    ),
    Reason.UPSTREAM_UNAVAILABLE: (
        "The provider refused the connection. Nothing was sent; the same request may be re-sent."
    ),
    Reason.MCP_REQUEST_INVALID: (
        "The MCP endpoint (`/_opgate/mcp`) refused the exchange itself: not a POST (it is "
        "stateless: no GET stream, no session), or not one JSON-RPC message as "
        "`application/json`. A JSON-RPC error answer (a parse error, a request whose `id` is "
        "null: -32600) is recorded with this code too."
    ),
    Reason.MCP_TOOL_FAILED: (
        "A tool call raised something no stage foresaw (a bug, logged with its traceback). The "
        "agent gets a tool error with this code and the exchange's record says `error`, never "
        "`allow`; the operation's row says whether anything was sent."
    ),
    Reason.MCP_TASK_NOT_CANCELLABLE: (
        "`tasks/cancel` of an operation that was claimed (something may have left) or is "
        "settled: only an operation still `created` is cancelled (its approval revoked, in one "
        "conditional statement), so a cancel never races a send. A proposal's task is "
        "cancelled while the proposal is pending (it is withdrawn); once approved, declined, "
        "expired or withdrawn, its cancel is refused so."
    ),
    Reason.MCP_SCOPE_INSUFFICIENT: (
        "An OAuth access token (`mcp_oauth`) that is valid but lacks the scope the request "
        "needs (`operations:read`, `operations:execute`, `proposals:write`); the 403 carries "
        '`WWW-Authenticate: Bearer error="insufficient_scope", scope="..."`.'
    ),
    Reason.MCP_TASK_INPUT_REFUSED: (
        "`tasks/update` carrying `content` in an input response: opgate asks a task's client "
        "only to open the console's approval page (URL-mode elicitation, answered by `action` "
        "alone), so content can only be an attempt to decide; the agent's token never approves "
        "or declines anything. Responses to keys opgate never asked are ignored, as the tasks "
        "extension says."
    ),
    Reason.MCP_ORIGIN_REFUSED: (
        "A request to the MCP endpoint with an `Origin` header that is not in "
        "`mcp_allowed_origins` (or with more than one): a browser page, which the MCP "
        "transport's DNS-rebinding rule says a server must answer 403. Checked before the "
        "token or the protocol; a request without `Origin` (an agent runtime) is not affected."
    ),
}

# Where a code is not simply answered with its status: what the table shows instead.
STATUS_SHOWN: dict[Reason, str] = {
    Reason.OPERATION_SCOPE_MISMATCH: "audit only",
    Reason.OUTCOME_UNKNOWN: "502/504",
    Reason.MCP_REQUEST_INVALID: "400/405/406/415",
}


def _cell(text: str) -> str:
    """One table cell: one line, ``|`` escaped, and ``<`` outside code spans escaped so that
    ``<data_dir>`` shows rather than being taken for an HTML tag."""
    spans = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(s if i % 2 else s.replace("<", "&lt;") for i, s in enumerate(spans))


def render_codes() -> str:
    """The rejection and outcome codes, in the order ``Reason`` declares them."""
    lines = [
        "# Rejection and outcome codes",
        "",
        "Every rejection is `application/problem+json` (RFC 9457) with `type`, `title`, `status`,"
        " a stable `code`, a `detail` sentence, the `operation_id` and `next_action`. Codes are"
        " never renamed. A confirmed operation sent again gets the stored answer with"
        " `Idempotent-Replayed: true`.",
        "",
        "| code | status | title | meaning | next action |",
        "|---|---|---|---|---|",
    ]
    for reason in Reason:
        info = REASONS[reason]
        status = STATUS_SHOWN.get(reason, str(info.status))
        lines.append(
            f"| `{reason.value}` | {status} | {_cell(info.title)} | {_cell(MEANINGS[reason])} "
            f"| {_cell(info.next_action)} |"
        )
    return HEADER.format(refresh=REFRESH, source="proxy/gate/reasons.py") + "\n".join(lines) + "\n"


def _default(name: str, field: Any) -> str:
    if field.default_factory is not None:
        made = field.default_factory()
        if isinstance(made, list | dict) and not made:
            return f"`{made!r}`"
        return "computed at start-up"
    value = field.default
    if value is None or value is PydanticUndefined:
        return "none"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, str):
        return f"`{value}`"
    return f"`{value!r}`"


def render_settings() -> str:
    """Every setting: its name, environment variable, default and description."""
    lines = [
        "# Configuration settings",
        "",
        "Flags > environment (`OPGATE_*`) > YAML config file"
        " (`OPGATE_CONFIG=/etc/opgate/config.yaml`). opgate refuses to start on an invalid"
        " setting or policy. Lists and maps are given as JSON in the environment"
        ' (`OPGATE_UPSTREAM_OVERRIDES=\'{"stripe": "http://127.0.0.1:8420"}\'`). Provider'
        " credentials are never settings: `OPGATE_SECRET_<NAME>` or `<secrets_dir>/<name>`.",
        "",
        "| setting | environment | default | description |",
        "|---|---|---|---|",
    ]
    prefix = str(Settings.model_config.get("env_prefix", ""))
    for name, field in Settings.model_fields.items():
        description = field.description or ""
        lines.append(
            f"| `{name}` | `{prefix}{name.upper()}` | {_default(name, field)} "
            f"| {_cell(description)} |"
        )
    return HEADER.format(refresh=REFRESH, source="proxy/settings.py") + "\n".join(lines) + "\n"


def _commands(
    parser: argparse.ArgumentParser, path: str
) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(command path, its one-line help, its parser), depth first in declaration order."""
    found: list[tuple[str, str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((f"{path} {name}", helps.get(name, ""), sub))
                found.extend(_commands(sub, f"{path} {name}"))
    return found


def _argument(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
    takes_value = action.nargs != 0
    if takes_value and action.option_strings:
        metavar = action.metavar or action.dest.upper()
        names += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    if action.nargs in ("*", "+"):
        names += " ..."
    return names


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        help_text = "" if action.help == argparse.SUPPRESS else (action.help or "")
        if action.choices:
            help_text += f" (one of: {', '.join(str(c) for c in action.choices)})"
        if action.option_strings and action.required:
            help_text += " (required)"
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            help_text += f" (default: {action.default})"
        rows.append(f"| {_argument(action)} | {_cell(help_text.strip())} |")
    if not rows:
        return []
    return ["| argument | |", "|---|---|", *rows, ""]


def render_cli(parser: argparse.ArgumentParser) -> str:
    """Each command of ``opgate`` (``parser``): what it does and every argument it takes."""
    lines = [
        "# Command line",
        "",
        "`opgate COMMAND ...` (also `python -m proxy`). Each command's `--help` says the same.",
        "",
        f"{_cell(parser.description or '')}",
        "",
    ]
    for path, help_text, sub in _commands(parser, parser.prog):
        lines += [f"## {path}", ""]
        if help_text or sub.description:
            lines += [_cell(sub.description or help_text), ""]
        lines += _arguments_table(sub)
    return HEADER.format(refresh=REFRESH, source="proxy/cli.py") + "\n".join(lines).rstrip() + "\n"


def reference_pages(
    parser: argparse.ArgumentParser,
) -> Mapping[str, Callable[[], str]]:
    """Each generated page's path under the repository, and what writes it."""
    return {
        "docs/reference/codes.md": render_codes,
        "docs/reference/settings.md": render_settings,
        "docs/reference/cli.md": lambda: render_cli(parser),
    }


def write_reference(parser: argparse.ArgumentParser, repo: Path) -> list[str]:
    """Write every generated page under ``repo``; the paths of those that changed."""
    changed = []
    for relative, render in reference_pages(parser).items():
        target = repo / relative
        text = render()
        if not target.is_file() or target.read_text("utf-8") != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, "utf-8")
            changed.append(relative)
    return changed
