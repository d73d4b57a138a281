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
from proxy.gate.reasons import Reason
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
