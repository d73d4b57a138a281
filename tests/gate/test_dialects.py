"""opgate's refusals in a provider's error shape (proxy/gate/dialects.py): each dialect keeps
opgate's code and sentence, picks the status its SDK maps to the fitting typed error, and says
whether a retry can help the way that SDK reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from proxy.gate.dialects import in_dialect
from proxy.gate.problem import PROBLEM, problem_response
from proxy.gate.reasons import REASONS, Reason
from proxy.policy.model import ErrorDialect


def render(dialect: ErrorDialect, reason: Reason, **kw: Any) -> web.Response:
    answer = in_dialect(problem_response(reason, "amount is 2000, approved 500", **kw), dialect)
    assert isinstance(answer, web.Response)
    return answer


def body(answer: web.Response) -> Any:
    assert answer.body is not None
    return json.loads(bytes(answer.body))  # type: ignore[arg-type]


def test_problem_is_the_default_shape() -> None:
    """`errors: problem` leaves the problem+json answer as it is."""
    original = problem_response(Reason.AMOUNT_MISMATCH, "x")
    assert in_dialect(original, ErrorDialect.PROBLEM) is original


def test_a_providers_own_answer_is_never_rewritten() -> None:
    """Only opgate's refusals carry the marker: a provider's 422 passes through untouched."""
    passed = web.Response(status=422, body=b'{"x": 1}', content_type="application/json")
    assert PROBLEM not in passed
    assert in_dialect(passed, ErrorDialect.STRIPE) is passed


@pytest.mark.parametrize(
    ("reason", "status", "kind", "retry"),
    [
        (Reason.AMOUNT_MISMATCH, 400, "invalid_request_error", "false"),
        (Reason.OPERATION_UNKNOWN, 404, "invalid_request_error", "false"),
        (Reason.AGENT_UNAUTHENTICATED, 401, "invalid_request_error", "false"),
        (Reason.OPERATION_IN_FLIGHT, 409, "idempotency_error", "true"),
        (Reason.PRECONDITION_FAILED, 409, "idempotency_error", "false"),
        (Reason.OPERATION_FAILED, 409, "idempotency_error", "false"),
        (Reason.RECONCILE_REQUIRED, 409, "idempotency_error", "false"),
        (Reason.OPERATION_ESCALATED, 409, "idempotency_error", "false"),
        (Reason.RATE_LIMITED, 429, "invalid_request_error", "true"),
        (Reason.PRECONDITION_UNVERIFIABLE, 503, "api_error", "true"),
        (Reason.CREDENTIAL_UNAVAILABLE, 503, "api_error", "true"),
    ],
)
def test_stripe_refusals(reason: Reason, status: int, kind: str, retry: str) -> None:
    """Stripe's {"error": {...}} with opgate's code, a status stripe-python maps to the typed
    error (a 422 becomes 400: InvalidRequestError), and Stripe-Should-Retry."""
    answer = render(ErrorDialect.STRIPE, reason, operation_id="op_1")
    error = body(answer)["error"]
    assert (answer.status, error["type"], error["code"]) == (status, kind, reason.value)
    assert answer.headers["Stripe-Should-Retry"] == retry
    assert "amount is 2000, approved 500" in error["message"]
    assert error["operation_id"] == "op_1"
    assert error["problem_type"].endswith(reason.value)


def test_retry_after_and_operation_headers_are_kept() -> None:
    """Retry-After and X-Operation-Id survive the rewrite."""
    answer = render(
        ErrorDialect.STRIPE, Reason.OPERATION_IN_FLIGHT, operation_id="op_1", retry_after=3
    )
    assert answer.headers["Retry-After"] == "3"
    assert answer.headers["X-Operation-Id"] == "op_1"


def test_paypal_refusal() -> None:
    """PayPal's name/message/details with opgate's code as the issue, status kept (422)."""
    answer = render(ErrorDialect.PAYPAL, Reason.AMOUNT_MISMATCH)
    data = body(answer)
    assert answer.status == 422
    assert data["name"] == "UNPROCESSABLE_ENTITY"
    assert data["details"] == [
        {"issue": "amount_mismatch", "description": "amount is 2000, approved 500"}
    ]
    assert data["code"] == "amount_mismatch"


def test_square_refusal() -> None:
    """Square's errors[] with category, opgate's code and the sentence."""
    answer = render(ErrorDialect.SQUARE, Reason.AMOUNT_MISMATCH)
    assert answer.status == 422
    assert body(answer)["errors"] == [
        {
            "category": "INVALID_REQUEST_ERROR",
            "code": "amount_mismatch",
            "detail": "amount is 2000, approved 500",
        }
    ]


def test_adyen_refusal() -> None:
    """Adyen's status/errorCode/message/errorType, status kept (422: a validation error)."""
    answer = render(ErrorDialect.ADYEN, Reason.AMOUNT_MISMATCH)
    data = body(answer)
    assert (answer.status, data["status"], data["errorCode"]) == (422, 422, "amount_mismatch")
    assert data["errorType"] == "validation"
    assert data["message"] == "amount_mismatch: amount is 2000, approved 500"


@pytest.mark.parametrize(
    ("dialect", "reason", "sent"),
    [
        # squareup retries >= 500, 408, 409 and 429 whatever the body says
        (ErrorDialect.SQUARE, Reason.OPERATION_FAILED, 400),
        (ErrorDialect.SQUARE, Reason.RECONCILE_REQUIRED, 400),
        (ErrorDialect.SQUARE, Reason.OPERATION_ESCALATED, 400),
        (ErrorDialect.SQUARE, Reason.PRECONDITION_FAILED, 400),
        (ErrorDialect.SQUARE, Reason.OPERATION_IN_FLIGHT, 409),
        (ErrorDialect.SQUARE, Reason.RATE_LIMITED, 429),
        (ErrorDialect.SQUARE, Reason.STORE_UNAVAILABLE, 503),
        # paypal-server-sdk retries 408, 413, 429 and 5xx (GET and PUT, when configured)
        (ErrorDialect.PAYPAL, Reason.BODY_TOO_LARGE, 400),
        (ErrorDialect.PAYPAL, Reason.OPERATION_FAILED, 409),
        (ErrorDialect.PAYPAL, Reason.RATE_LIMITED, 429),
        # Adyen retries nothing
        (ErrorDialect.ADYEN, Reason.OPERATION_FAILED, 409),
        (ErrorDialect.ADYEN, Reason.BODY_TOO_LARGE, 413),
    ],
)
def test_a_permanent_refusal_gets_a_status_its_sdk_does_not_retry(
    dialect: ErrorDialect, reason: Reason, sent: int
) -> None:
    """A permanent refusal whose status the SDK re-sends by itself is answered 400, opgate's
    own status and code kept in the body; a retryable one keeps its status."""
    answer = render(dialect, reason, operation_id="op_1")
    data = body(answer)
    assert answer.status == sent
    assert (data["status"], data["code"]) == (REASONS[reason].status, reason.value)


@pytest.mark.parametrize("dialect", [d for d in ErrorDialect if d is not ErrorDialect.PROBLEM])
def test_a_key_mismatch_says_how_the_sdk_sends_the_approved_key(dialect: ErrorDialect) -> None:
    """idempotency_key_mismatch names, in the SDK's terms, where the approved key goes."""
    answer = in_dialect(
        problem_response(Reason.IDEMPOTENCY_KEY_MISMATCH, "the key is not the approved one"),
        dialect,
    )
    assert isinstance(answer, web.Response)
    text = json.dumps(body(answer))
    assert "the approved key" in text
    assert "idempotency_key" in text or "paypal_request_id" in text
