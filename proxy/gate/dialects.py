"""opgate's refusals in a provider's own error shape (``errors:`` in a policy). Pure.

An agent talks to a provider through its SDK, which reads only that provider's error bodies: a
problem+json answer surfaces as an untyped "invalid response" with no code. In a provider's
dialect the refusal is that provider's error object carrying opgate's stable code and sentence,
with the problem+json fields alongside where the shape allows, and a status the SDK maps to the
typed error that fits (a mismatch is the SDK's invalid-request error, not a server error).

Retrying: a permanent refusal (every code but ``reasons.RETRYABLE``) is answered so that the
SDK does not send it again on its own: Stripe reads ``Stripe-Should-Retry: false``; where an
SDK retries a status whatever the body says (Square: 409), the refusal gets a status it does
not retry, opgate's own ``status`` and ``code`` staying in the body. A retryable refusal keeps
its status and ``Retry-After``, which every one of these SDKs honours or ignores safely.

An ``idempotency_key_mismatch`` says, in the SDK's terms, how that SDK sends the approved key.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from proxy.gate.problem import PROBLEM
from proxy.gate.reasons import RETRYABLE, Reason
from proxy.policy.model import ErrorDialect

# Headers of opgate's refusal kept on the dialect's answer.
_KEPT = ("X-Operation-Id", "X-Operation-Status", "Retry-After")

# The statuses each SDK sends again by itself, whatever the body says (as installed):
# - squareup 46: square/core/http_client.py:120-122 (``_should_retry``: >= 500, 408, 409, 429;
#   max_retries 2 by default, any method).
# - paypal-server-sdk 2.4: paypalserversdk/configuration.py:117-122 (408, 413, 429, 500, 502,
#   503, 504, 521, 522, 524; GET and PUT only, max_retries 0 unless configured), applied by
#   urllib3's Retry in apimatic_requests_client_adapter/requests_client.py:110-111.
# - Adyen 16: none (Adyen/httpclient.py sends each request once; no retry in the package).
# - stripe 16.1: stripe/_http_client.py:144-160: ``Stripe-Should-Retry`` decides, else 409 and
#   >= 500; so the Stripe dialect keeps its statuses and always sends the header.
_SQUARE_RETRIES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_PAYPAL_RETRIES = frozenset({408, 413, 429, 500, 502, 503, 504, 521, 522, 524})

# How each SDK sends the approved key (its own default key would be a mismatch).
_KEY_HOW = {
    ErrorDialect.STRIPE: (
        "stripe-python puts a key of its own on every POST, so X-Operation-Id alone cannot "
        'name the operation: pass options={"idempotency_key": <the approved key>}'
    ),
    ErrorDialect.SQUARE: "squareup: pass idempotency_key=<the approved key> (in the body)",
    ErrorDialect.PAYPAL: (
        'paypal-server-sdk: pass "paypal_request_id": <the approved key>, or none and '
        "X-Operation-Id"
    ),
    ErrorDialect.ADYEN: (
        "Adyen: pass idempotency_key=<the approved key>, or none and X-Operation-Id"
    ),
}


def in_dialect(response: web.StreamResponse, dialect: ErrorDialect) -> web.StreamResponse:
    """``response`` rewritten in ``dialect`` if it is one of opgate's problem answers."""
    problem = response.get(PROBLEM) if isinstance(response, web.Response) else None
    if problem is None or dialect is ErrorDialect.PROBLEM:
        return response
    if problem["code"] == Reason.IDEMPOTENCY_KEY_MISMATCH:
        problem = {**problem, "detail": f"{problem['detail']}; {_KEY_HOW[dialect]}"}
    status, body, headers = _RENDERERS[dialect](problem)
    answer = web.Response(
        status=status,
        body=json.dumps(body, allow_nan=False).encode("utf-8"),
        content_type="application/json",
    )
    for name in _KEPT:
        if name in response.headers:
            answer.headers[name] = response.headers[name]
    answer.headers.update(headers)
    answer[PROBLEM] = problem
    return answer


def _not_resent(problem: dict[str, Any], retried: frozenset[int]) -> int:
    """The status to answer ``problem`` with to an SDK that re-sends ``retried`` by itself:
    its own, unless it is permanent and the SDK would re-send it (then 400, an invalid-request
    error in every one of these SDKs; opgate's status stays in the body)."""
    status: int = problem["status"]
    if status in retried and problem["code"] not in RETRYABLE:
        return 400
    return status


def _alongside(problem: dict[str, Any]) -> dict[str, Any]:
    """The problem+json fields, kept next to the provider's own where its shape allows (a
    failed precondition's evidence too: what the provider showed is the refusal's reason)."""
    fields = {
        "type": problem["type"],
        "title": problem["title"],
        "status": problem["status"],
        "detail": problem["detail"],
        "operation_id": problem["operation_id"],
        "next_action": problem["next_action"],
        # budget_exceeded: the remaining budget, whatever the dialect
        **({"budget": problem["budget"]} if "budget" in problem else {}),
    }
    if "precondition" in problem:
        fields["precondition"] = problem["precondition"]
    return fields


def stripe(problem: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Stripe's ``{"error": {...}}``. stripe-python raises InvalidRequestError only for 400
    and 404 (a 422 would be a bare APIError), so content refusals become 400; 401, 402, 403,
    404, 409 and 429 keep their meaning (AuthenticationError, ..., RateLimitError)."""
    status = problem["status"]
    kept = {401, 402, 403, 404, 409, 429}
    sent = status if status in kept or status >= 500 else 400
    kind = {
        401: "invalid_request_error",
        409: "idempotency_error",
        429: "invalid_request_error",
    }.get(sent, "api_error" if sent >= 500 else "invalid_request_error")
    error = {
        **_alongside(problem),
        # Stripe's own `type` (the SDK reads it); the problem's URI moves to problem_type
        "type": kind,
        "problem_type": problem["type"],
        "code": problem["code"],
        "message": f"{problem['title']}: {problem['detail']}",
        "doc_url": problem["type"],
    }
    retry = "true" if problem["code"] in RETRYABLE else "false"
    return sent, {"error": error}, {"Stripe-Should-Retry": retry}


_PAYPAL_NAMES = {
    400: "INVALID_REQUEST",
    401: "AUTHENTICATION_FAILURE",
    403: "NOT_AUTHORIZED",
    404: "RESOURCE_NOT_FOUND",
    409: "RESOURCE_CONFLICT",
    422: "UNPROCESSABLE_ENTITY",
    429: "RATE_LIMIT_REACHED",
}


def paypal(problem: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """PayPal's ``{"name", "message", "debug_id", "details": [{"issue", "description"}]}``:
    the SDK's ErrorException carries them; opgate's code is the detail's ``issue``."""
    status = _not_resent(problem, _PAYPAL_RETRIES)
    fallback = "INTERNAL_SERVER_ERROR" if status >= 500 else "INVALID_REQUEST"
    name = _PAYPAL_NAMES.get(status, fallback)
    body = {
        "name": name,
        "message": f"{problem['title']}: {problem['detail']}",
        "debug_id": problem["operation_id"] or "opgate",
        "details": [{"issue": problem["code"], "description": problem["detail"]}],
        "links": [{"href": problem["type"], "rel": "information_link"}],
        "code": problem["code"],
        # OAuth's error fields (RFC 6749 section 5.2): what the SDK's token request reads
        # (paypalserversdk/exceptions/o_auth_provider_exception.py:37-45, for 400 and 401)
        "error": problem["code"],
        "error_description": f"{problem['title']}: {problem['detail']}",
        **_alongside(problem),
    }
    return status, body, {}


def square(problem: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Square's ``{"errors": [{"category", "code", "detail"}]}`` (the SDK's ApiError.errors)."""
    status = _not_resent(problem, _SQUARE_RETRIES)
    category = {401: "AUTHENTICATION_ERROR", 429: "RATE_LIMIT_ERROR"}.get(
        status, "API_ERROR" if status >= 500 else "INVALID_REQUEST_ERROR"
    )
    error = {"category": category, "code": problem["code"], "detail": problem["detail"]}
    return status, {"errors": [error], "code": problem["code"], **_alongside(problem)}, {}


def adyen(problem: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Adyen's ``{"status", "errorCode", "message", "errorType"}``: the SDK raises its error
    class for the status (422 AdyenAPIUnprocessableEntity, 401, 403, ...) with errorCode."""
    status = problem["status"]
    error_type = {401: "security", 403: "security"}.get(
        status, "internal" if status >= 500 else "validation"
    )
    body = {
        "status": status,
        "errorCode": problem["code"],
        "message": f"{problem['code']}: {problem['detail']}",
        "errorType": error_type,
        "pspReference": problem["operation_id"],
        "code": problem["code"],
        **_alongside(problem),
    }
    return status, body, {}


_Render = Callable[[dict[str, Any]], tuple[int, dict[str, Any], dict[str, str]]]
_RENDERERS: dict[ErrorDialect, _Render] = {
    ErrorDialect.STRIPE: stripe,
    ErrorDialect.PAYPAL: paypal,
    ErrorDialect.SQUARE: square,
    ErrorDialect.ADYEN: adyen,
}
