"""The stable rejection and outcome codes an agent, an operator and an auditor see.

Each code is part of opgate's public contract: agents branch on it, audit queries filter on it.
Never rename one; add new ones. The HTTP status follows the IETF Idempotency-Key draft where it
speaks (422: the same key with a different payload; 409: a retry while the original is in flight).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    # routing and identity
    NO_ROUTE = "no_route"
    NO_MATCHING_RULE = "no_matching_rule"
    AGENT_UNAUTHENTICATED = "agent_unauthenticated"
    AMBIGUOUS_REQUEST = "ambiguous_request"
    PATH_NOT_CANONICAL = "path_not_canonical"
    REQUEST_MALFORMED = "request_malformed"
    HEADER_INVALID = "header_invalid"
    OPERATION_ID_INVALID = "operation_id_invalid"
    EXPECTATION_UNSUPPORTED = "expectation_unsupported"
    OPERATION_ID_RESERVED = "operation_id_reserved"
    # forward-proxy mode
    PROXY_AUTH_REQUIRED = "proxy_auth_required"
    PROXY_REQUEST_INVALID = "proxy_request_invalid"
    HOST_NOT_ALLOWED = "host_not_allowed"
    DESTINATION_NOT_ALLOWED = "destination_not_allowed"
    MISDIRECTED_REQUEST = "misdirected_request"
    # body
    BODY_TOO_LARGE = "body_too_large"
    BODY_INVALID = "body_invalid"
    CONTENT_TYPE_MISMATCH = "content_type_mismatch"
    QUERY_NOT_ALLOWED = "query_not_allowed"
    BODY_TIMEOUT = "body_timeout"
    # the operation and its approval
    OPERATION_REQUIRED = "operation_required"
    OPERATION_UNKNOWN = "operation_unknown"
    OPERATION_SCOPE_MISMATCH = "operation_scope_mismatch"
    TARGET_MISMATCH = "target_mismatch"
    IDEMPOTENCY_KEY_MISMATCH = "idempotency_key_mismatch"
    AMOUNT_MISMATCH = "amount_mismatch"
    CURRENCY_MISMATCH = "currency_mismatch"
    PARAMETER_MISMATCH = "parameter_mismatch"
    PARAMETER_UNEXPECTED = "parameter_unexpected"
    INJECTION_CONFLICT = "injection_conflict"
    APPROVAL_REVOKED = "approval_revoked"
    APPROVAL_EXPIRED = "approval_expired"
    # the operation's state
    OPERATION_IN_FLIGHT = "operation_in_flight"
    OPERATION_FAILED = "operation_failed"
    RECONCILE_REQUIRED = "reconcile_required"
    OPERATION_ESCALATED = "operation_escalated"
    CLAIM_REFUSED = "claim_refused"
    DECISION_STALE = "decision_stale"
    # proposals (the agent asks a human for the approval of an exact request)
    PROPOSAL_INVALID = "proposal_invalid"
    APPROVAL_NOT_SENDABLE = "approval_not_sendable"
    # the application's Idempotency-Key on POST /v1/operations
    IDEMPOTENCY_KEY_REUSED = "idempotency_key_reused"
    PROPOSAL_UNKNOWN = "proposal_unknown"
    PROPOSAL_NOT_WITHDRAWABLE = "proposal_not_withdrawable"
    # approvals a person signed (AP2 Payment Mandates, proxy/mandates/)
    MANDATES_NOT_SUPPORTED = "mandates_not_supported"
    MANDATE_INVALID = "mandate_invalid"
    MANDATE_EXPIRED = "mandate_expired"
    MANDATE_ISSUER_UNKNOWN = "mandate_issuer_unknown"
    MANDATE_MISMATCH = "mandate_mismatch"
    MANDATE_CONSTRAINT_FAILED = "mandate_constraint_failed"
    MANDATE_EXHAUSTED = "mandate_exhausted"
    MANDATE_REVOKED = "mandate_revoked"
    MANDATE_NONCE_UNKNOWN = "mandate_nonce_unknown"
    MANDATE_NONCE_USED = "mandate_nonce_used"
    MANDATE_RECEIPT_INVALID = "mandate_receipt_invalid"
    AGENT_SIGNING_KEY_MISSING = "agent_signing_key_missing"
    # the provider's state, asked before the send (the rule's preconditions)
    PRECONDITION_FAILED = "precondition_failed"
    PRECONDITION_UNVERIFIABLE = "precondition_unverifiable"
    # x402: the provider asked for a payment (policy rule's x402, docs/x402.md)
    X402_CHALLENGE_INVALID = "x402_challenge_invalid"
    X402_NOT_APPROVED = "x402_not_approved"
    X402_PAYMENT_REFUSED = "x402_payment_refused"
    X402_PAID_ANSWER_LOST = "x402_paid_answer_lost"
    X402_PAYMENT_INVALID = "x402_payment_invalid"
    PAYMENT_AUTHORIZATION_MISMATCH = "payment_authorization_mismatch"
    X402_BUDGET_EXCEEDED = "x402_budget_exceeded"
    X402_MANDATE_BUDGET_EXCEEDED = "x402_mandate_budget_exceeded"
    # limits
    AGENT_CONCURRENCY_EXCEEDED = "agent_concurrency_exceeded"
    RATE_LIMITED = "rate_limited"
    BUDGET_EXCEEDED = "budget_exceeded"
    # could not decide or could not forward
    STORE_UNAVAILABLE = "store_unavailable"
    CREDENTIAL_UNAVAILABLE = "credential_unavailable"
    OUTCOME_UNKNOWN = "outcome_unknown"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    # the MCP endpoint (/_opgate/mcp)
    MCP_REQUEST_INVALID = "mcp_request_invalid"
    MCP_TOOL_FAILED = "mcp_tool_failed"
    MCP_TASK_NOT_CANCELLABLE = "mcp_task_not_cancellable"
    MCP_SCOPE_INSUFFICIENT = "mcp_scope_insufficient"
    MCP_TASK_INPUT_REFUSED = "mcp_task_input_refused"
    MCP_ORIGIN_REFUSED = "mcp_origin_refused"


# Refusals the same request, sent again later, may get another answer to: a limit, an attempt in
# flight, opgate or the provider unreachable for now, an outcome a re-send resolves (through
# proxy/gate/resend.py). Every other refusal is permanent: a re-send only repeats it (a
# provider's dialect tells its SDK so, proxy/gate/dialects.py).
RETRYABLE: frozenset[Reason] = frozenset(
    {
        Reason.BODY_TIMEOUT,
        Reason.OPERATION_IN_FLIGHT,
        Reason.CLAIM_REFUSED,
        Reason.DECISION_STALE,
        Reason.PRECONDITION_UNVERIFIABLE,
        Reason.AGENT_CONCURRENCY_EXCEEDED,
        Reason.RATE_LIMITED,
        Reason.STORE_UNAVAILABLE,
        Reason.CREDENTIAL_UNAVAILABLE,
        Reason.OUTCOME_UNKNOWN,
        Reason.UPSTREAM_UNAVAILABLE,
    }
)


@dataclass(frozen=True)
class ReasonInfo:
    status: int
    title: str
    next_action: str


REASONS: dict[Reason, ReasonInfo] = {
    Reason.NO_ROUTE: ReasonInfo(
        404,
        "No provider is configured for this path",
        "Use a route prefix from opgate's policies (for example /stripe/...).",
    ),
    Reason.NO_MATCHING_RULE: ReasonInfo(
        403,
        "No policy rule allows this request",
        "Only calls a policy names may leave; ask the platform team to add a rule.",
    ),
    Reason.AGENT_UNAUTHENTICATED: ReasonInfo(
        401,
        "The agent is not authenticated",
        "Send your opgate agent token (Proxy-Authorization, or the provider's auth header).",
    ),
    Reason.AMBIGUOUS_REQUEST: ReasonInfo(
        400,
        "The request is ambiguous",
        "Send each of these headers at most once, with one consistent value.",
    ),
    Reason.PATH_NOT_CANONICAL: ReasonInfo(
        400,
        "The path is not in canonical form",
        "Send the plain path: no percent-escapes, dot segments or empty segments.",
    ),
    Reason.REQUEST_MALFORMED: ReasonInfo(
        400,
        "The request is not well-formed HTTP",
        "Send one Content-Length or chunked framing, not both; no malformed request line.",
    ),
    Reason.HEADER_INVALID: ReasonInfo(
        400,
        "A header value is not valid text",
        "Send header values as printable ASCII: no NUL, control characters or invalid UTF-8.",
    ),
    Reason.OPERATION_ID_INVALID: ReasonInfo(
        400,
        "The operation id is not valid",
        "Use the operation id exactly as the approval returned it (printable ASCII).",
    ),
    Reason.EXPECTATION_UNSUPPORTED: ReasonInfo(
        417,
        "The Expect header asks for something opgate does not do",
        "Send no Expect header, or Expect: 100-continue.",
    ),
    Reason.OPERATION_ID_RESERVED: ReasonInfo(
        400,
        "The operation id starts with a prefix reserved for another kind of id",
        "Choose an operation id that does not start with prop_ or ap2_, or leave it out and "
        "let opgate choose one.",
    ),
    # forward-proxy mode
    Reason.PROXY_AUTH_REQUIRED: ReasonInfo(
        407,
        "The proxy needs the agent's token",
        "Put your opgate token in the proxy URL (http://agent:TOKEN@opgate:3128) or send "
        "Proxy-Authorization: Bearer TOKEN.",
    ),
    Reason.PROXY_REQUEST_INVALID: ReasonInfo(
        400,
        "Not a proxy request opgate accepts",
        "Send CONNECT host:port, or an absolute-form request (POST http://host/path).",
    ),
    Reason.HOST_NOT_ALLOWED: ReasonInfo(
        403,
        "No policy names this host",
        "Only providers and pass-through hosts a policy names are reachable.",
    ),
    Reason.DESTINATION_NOT_ALLOWED: ReasonInfo(
        403,
        "The host resolves to an address opgate does not reach",
        "Loopback, private, link-local and metadata addresses need an explicit policy "
        "allowance (forward_proxy.allow_destinations).",
    ),
    Reason.MISDIRECTED_REQUEST: ReasonInfo(
        421,
        "The Host header, the TLS server name and the proxy target disagree",
        "Address one host: the same name in the CONNECT target, the SNI and the Host header.",
    ),
    Reason.BODY_TOO_LARGE: ReasonInfo(
        413,
        "The request body is larger than the policy allows",
        "Send a smaller body; opgate validates every byte it forwards.",
    ),
    Reason.BODY_INVALID: ReasonInfo(
        400,
        "The request body does not parse unambiguously",
        "Send a body that parses one way only: no duplicated keys, no content encoding.",
    ),
    Reason.CONTENT_TYPE_MISMATCH: ReasonInfo(
        415,
        "The content type disagrees with the rule",
        "Send the body in the media type this provider's rule expects.",
    ),
    Reason.QUERY_NOT_ALLOWED: ReasonInfo(
        400,
        "A query string is not allowed on this call",
        "Put every parameter in the body, where opgate validates it.",
    ),
    Reason.BODY_TIMEOUT: ReasonInfo(
        408,
        "The request body did not arrive in time",
        "Send the whole body promptly; opgate bounds how long it waits for it.",
    ),
    Reason.OPERATION_REQUIRED: ReasonInfo(
        400,
        "This call needs an approved operation",
        "Name the operation with X-Operation-Id (or its approved idempotency key); "
        "if there is none, ask the application to approve one.",
    ),
    Reason.OPERATION_UNKNOWN: ReasonInfo(
        404,
        "No such operation",
        "Check the operation id; do not invent one. Ask the application for an approved one.",
    ),
    Reason.OPERATION_SCOPE_MISMATCH: ReasonInfo(
        403,
        "The operation belongs to another tenant or agent",
        "Use only operations approved for your own scope.",
    ),
    Reason.TARGET_MISMATCH: ReasonInfo(
        422,
        "The request targets something other than the approved operation",
        "Send exactly the approved method and path; do not re-plan the call.",
    ),
    Reason.IDEMPOTENCY_KEY_MISMATCH: ReasonInfo(
        422,
        "The idempotency key differs from the approved one",
        "Send the operation's approved idempotency key, or none (opgate adds it).",
    ),
    Reason.AMOUNT_MISMATCH: ReasonInfo(
        422,
        "The amount differs from the approved amount",
        "Send exactly the approved amount; a different amount needs a new approval.",
    ),
    Reason.CURRENCY_MISMATCH: ReasonInfo(
        422,
        "The currency differs from the approved currency",
        "Send exactly the approved currency.",
    ),
    Reason.PARAMETER_MISMATCH: ReasonInfo(
        422,
        "An approved parameter differs or is missing",
        "Send every approved parameter exactly as approved.",
    ),
    Reason.PARAMETER_UNEXPECTED: ReasonInfo(
        422,
        "The request carries a parameter that was not approved",
        "Remove parameters that the approval and the rule do not name.",
    ),
    Reason.INJECTION_CONFLICT: ReasonInfo(
        422,
        "The request sets a field opgate injects, to another value",
        "Leave the operation metadata to opgate.",
    ),
    Reason.APPROVAL_REVOKED: ReasonInfo(
        403,
        "The approval was revoked",
        "Do not send; ask the recovery protocol what is owed (a revoked approval may still "
        "have an outcome to reconcile).",
    ),
    Reason.APPROVAL_EXPIRED: ReasonInfo(
        403,
        "The approval has expired",
        "Do not send; a new attempt needs a new approval.",
    ),
    Reason.OPERATION_IN_FLIGHT: ReasonInfo(
        409,
        "An attempt of this operation is in flight",
        "Wait and ask again after Retry-After; do not send a different request.",
    ),
    Reason.OPERATION_FAILED: ReasonInfo(
        409,
        "The operation failed at the provider",
        "The provider's answer is attached; a new attempt needs a new approved operation.",
    ),
    Reason.RECONCILE_REQUIRED: ReasonInfo(
        409,
        "The last attempt's outcome is unknown and a re-send could duplicate it",
        "Do not re-send; the operation must be reconciled with the provider first.",
    ),
    Reason.OPERATION_ESCALATED: ReasonInfo(
        409,
        "The operation is escalated to a human",
        "Do not send; wait for the human verdict (ask the recovery endpoint).",
    ),
    Reason.CLAIM_REFUSED: ReasonInfo(
        409,
        "The claim refused a send the operation's state allows",
        "Nothing was sent. Ask again after Retry-After; if it persists, the operator has the "
        "log line claim_refused (read get_operation's next_action meanwhile).",
    ),
    Reason.DECISION_STALE: ReasonInfo(
        409,
        "The operation changed, or the decision's deadline passed, before the claim",
        "Nothing was sent. Send the identical request again: it is decided on the row as it "
        "is then.",
    ),
    Reason.PROPOSAL_INVALID: ReasonInfo(
        400,
        "The proposal is not one",
        "Nothing was proposed. Send provider, action, path_params, amount, currency, params "
        "and a reason, as the errors say.",
    ),
    Reason.APPROVAL_NOT_SENDABLE: ReasonInfo(
        422,
        "No request could carry this approval",
        "Nothing was proposed. Propose what the rule can send (the errors say what cannot).",
    ),
    Reason.IDEMPOTENCY_KEY_REUSED: ReasonInfo(
        422,
        "This Idempotency-Key was used for another approval",
        "Nothing was created. Send a new Idempotency-Key for a new approval; retry an "
        "approval only with its own key and the same body.",
    ),
    Reason.PROPOSAL_UNKNOWN: ReasonInfo(
        404,
        "No such proposal",
        "Use the proposal id opgate answered when you proposed.",
    ),
    Reason.PROPOSAL_NOT_WITHDRAWABLE: ReasonInfo(
        409,
        "The proposal is no longer pending",
        "Read the proposal (GET /_opgate/v1/proposals/{id}) and follow its next_action; an "
        "approved one's operation is cancelled as an operation (MCP tasks/cancel) while "
        "nothing has left.",
    ),
    Reason.MANDATES_NOT_SUPPORTED: ReasonInfo(
        404,
        "This opgate accepts no mandates",
        "Nothing was created. Ask for an approval another way (a proposal), or have the "
        "operator configure the mandate's issuer (mandate_issuers).",
    ),
    Reason.MANDATE_INVALID: ReasonInfo(
        403,
        "The mandate does not verify",
        "Nothing was created. The detail names the failed step; present the mandate as the "
        "person's surface issued it, with its disclosures and, when bound, a key binding for "
        "this opgate's audience.",
    ),
    Reason.MANDATE_EXPIRED: ReasonInfo(
        403,
        "The mandate has expired",
        "Nothing was created. Ask the person for a new mandate.",
    ),
    Reason.MANDATE_ISSUER_UNKNOWN: ReasonInfo(
        403,
        "No trusted issuer signed this mandate",
        "Nothing was created. Only mandates from the issuers configured for your tenant "
        "approve operations.",
    ),
    Reason.MANDATE_MISMATCH: ReasonInfo(
        403,
        "The request differs from what the person approved",
        "Nothing was created. The field named differs; send what the mandate says, or ask the "
        "person for a new mandate.",
    ),
    Reason.MANDATE_CONSTRAINT_FAILED: ReasonInfo(
        403,
        "A constraint of the person's open mandate is not met",
        "Nothing was created. The constraint named fails (AP2: an unknown one always fails); "
        "ask the person for a closed mandate.",
    ),
    Reason.MANDATE_EXHAUSTED: ReasonInfo(
        403,
        "The open mandate allows no more payments",
        "Nothing was created. Its uses or its budget are spent; ask the person again.",
    ),
    Reason.MANDATE_REVOKED: ReasonInfo(
        403,
        "The mandate was revoked",
        "Nothing was created. An operator revoked it; ask the person for a new mandate.",
    ),
    Reason.MANDATE_NONCE_UNKNOWN: ReasonInfo(
        403,
        "The key binding answers no nonce opgate issued to this agent",
        "Nothing was created. Ask POST /_opgate/v1/mandates/nonces for a nonce, bind the "
        "mandate to it (the key binding's nonce) and present it within the nonce's lifetime.",
    ),
    Reason.AGENT_SIGNING_KEY_MISSING: ReasonInfo(
        403,
        "This provider takes only requests signed as the agent, and opgate holds no key for you",
        "Nothing was sent. The operator gives this agent a signing key "
        "(agents[].signing_key_file).",
    ),
    Reason.MANDATE_NONCE_USED: ReasonInfo(
        403,
        "The key binding's nonce already answered another presentation",
        "Nothing was created. A nonce answers one presentation: ask for a new one and bind the "
        "mandate to it.",
    ),
    Reason.MANDATE_RECEIPT_INVALID: ReasonInfo(
        403,
        "This is not a receipt opgate signed for an operation",
        "Nothing was read. Present a receipt exactly as opgate answered it (a success receipt "
        "naming an operation); a receipt signed by any other key, or altered, proves nothing.",
    ),
    Reason.PRECONDITION_FAILED: ReasonInfo(
        409,
        "The provider no longer shows what the approval assumed",
        "Nothing was sent. The lookup's evidence is attached; a new attempt needs a new "
        "approval, decided on the world as it is now.",
    ),
    Reason.PRECONDITION_UNVERIFIABLE: ReasonInfo(
        503,
        "The rule's preconditions could not be checked with the provider",
        "Nothing was sent. Try again later with the same request.",
    ),
    Reason.X402_CHALLENGE_INVALID: ReasonInfo(
        502,
        "The provider asked for a payment in a form opgate does not read",
        "Nothing was signed or paid. The provider's 402 was not a well-formed x402 version 2 "
        "PAYMENT-REQUIRED; ask the operator to check the provider.",
    ),
    Reason.X402_NOT_APPROVED: ReasonInfo(
        403,
        "The provider asks for a payment the approval does not cover",
        "Nothing was signed or paid. The detail names the term that does not fit (resource, "
        "amount, asset, network, payee, scheme); paying otherwise needs a new approval.",
    ),
    Reason.X402_PAYMENT_REFUSED: ReasonInfo(
        502,
        "The provider refused the operation's payment",
        "opgate sent the operation's one payment and will never sign another; the payment's "
        "evidence is attached. Ask opgate for the operation's status; do not pay it another "
        "way.",
    ),
    Reason.X402_PAID_ANSWER_LOST: ReasonInfo(
        502,
        "The operation was paid and the provider's answer to it was lost",
        "The operation is settled as paid: its one payment's nonce is used (the evidence is "
        "attached) and opgate will never pay it again. The provider did not keep its answer "
        "under the payment-identifier extension, so it cannot be recovered through opgate; "
        "ask the provider or the operator for it.",
    ),
    Reason.X402_PAYMENT_INVALID: ReasonInfo(
        400,
        "The agent's PAYMENT-SIGNATURE is not a payment opgate can read",
        "Nothing was sent. Send an x402 version 2 exact EIP-3009 payment, base64 JSON, signed "
        "by its payer, or send the request without one.",
    ),
    Reason.PAYMENT_AUTHORIZATION_MISMATCH: ReasonInfo(
        422,
        "The operation is bound to another payment authorization",
        "Nothing was sent. The operation's first authorization is its only one: send that one "
        "again (the same PAYMENT-SIGNATURE), or ask opgate for the operation's status.",
    ),
    Reason.X402_BUDGET_EXCEEDED: ReasonInfo(
        403,
        "The payment would exceed an x402 budget or payment rate limit",
        "Nothing was paid or sent, and re-sending will not help while the limit is spent: the "
        "limit and what its tenant or agent has paid in its window are attached. Wait for the "
        "window, or ask the operator.",
    ),
    Reason.X402_MANDATE_BUDGET_EXCEEDED: ReasonInfo(
        403,
        "The payment would exceed the budget of the open mandate that approved the operation",
        "Nothing was paid or sent: the payments already kept under the AP2 open mandate, across "
        "its payees, leave no room for this one (or an asset has no peg to the mandate's "
        "currency). Ask the person for a new mandate, or the operator.",
    ),
    Reason.AGENT_CONCURRENCY_EXCEEDED: ReasonInfo(
        429,
        "This agent has too many requests in flight",
        "Nothing was sent. Wait for an answer to a request in flight, then try again after "
        "Retry-After.",
    ),
    Reason.RATE_LIMITED: ReasonInfo(
        429,
        "Too many requests from this agent or tenant",
        "Nothing was sent. Slow down: try again after Retry-After.",
    ),
    Reason.BUDGET_EXCEEDED: ReasonInfo(
        403,
        "The operation would exceed a spend budget",
        "Nothing was sent, and re-sending will not help while the budget is spent: the "
        "remaining budget is attached. Ask for a smaller amount, or wait for the window.",
    ),
    Reason.STORE_UNAVAILABLE: ReasonInfo(
        503,
        "The operation store is unavailable",
        "Nothing was sent. Try again later with the same request (an approval: with the same "
        "Idempotency-Key, which answers the operation if it was created after all).",
    ),
    Reason.CREDENTIAL_UNAVAILABLE: ReasonInfo(
        503,
        "opgate has no credential configured for this provider",
        "Nothing was sent. Ask the platform team to configure the provider credential.",
    ),
    Reason.OUTCOME_UNKNOWN: ReasonInfo(
        502,
        "The provider's answer is unknown",
        "The effect may or may not have happened. Do not re-plan: ask opgate for the "
        "operation's status and follow the recovery protocol.",
    ),
    Reason.UPSTREAM_UNAVAILABLE: ReasonInfo(
        502,
        "The provider could not be reached",
        "Try again later.",
    ),
    Reason.MCP_REQUEST_INVALID: ReasonInfo(
        400,
        "The MCP exchange is not one opgate serves",
        "POST one JSON-RPC message as application/json; the endpoint is stateless: no GET "
        "stream, no session to delete.",
    ),
    Reason.MCP_TOOL_FAILED: ReasonInfo(
        500,
        "The tool call failed inside opgate",
        "A bug, logged for the operator. Read the operation with get_operation before calling "
        "execute_operation again: its row says whether anything was sent.",
    ),
    Reason.MCP_TASK_NOT_CANCELLABLE: ReasonInfo(
        409,
        "The task can no longer be cancelled",
        "Something may have left, or it is settled: follow the task (tasks/get) or "
        "get_operation's next_action.",
    ),
    Reason.MCP_SCOPE_INSUFFICIENT: ReasonInfo(
        403,
        "The access token does not grant this",
        "Ask the authorization server for a token with the scope named in WWW-Authenticate.",
    ),
    Reason.MCP_TASK_INPUT_REFUSED: ReasonInfo(
        403,
        "A task's client cannot decide for an approver",
        "Answer the approval request with its action only (accept, decline, cancel); an "
        "approver decides on opgate's console. Follow the task with tasks/get.",
    ),
    Reason.MCP_ORIGIN_REFUSED: ReasonInfo(
        403,
        "The request's Origin may not call the MCP endpoint",
        "Call it from an agent runtime (no Origin header), or have the operator list the "
        "page's origin in mcp_allowed_origins.",
    ),
}
