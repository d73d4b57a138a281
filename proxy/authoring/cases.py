"""Policy test cases: ``<name>.tests.yaml`` next to the policies, run by ``opgate policy test``.

A case is a request as an agent sends it, the operation row the store holds (if any), the
provider's answers to the rule's precondition lookups (if any), and the decision expected in
the audit record's words (``allow``/``deny``/``replay``, the reason code, ``would_deny`` in
shadow mode). Cases run through ``proxy.authoring.explain``, i.e. the pipeline's own intake,
checks and precondition judgement: a case that passes here is decided the same way by a
running opgate.

Pure but for ``load_cases`` (reads files).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from pydantic import BaseModel, ConfigDict, Field

from proxy.authoring.explain import Explanation, SampleRequest, explain
from proxy.gate.checks import Agent
from proxy.gate.decision import ClaimKind
from proxy.gate.lookup import Inconclusive
from proxy.gate.preconditions import LookupAnswer
from proxy.gate.reasons import Reason
from proxy.policy.load import TESTS_SUFFIX, PolicyProblem, parse_yaml_model
from proxy.policy.set import PolicySet
from proxy.store.operation import LastOutcome, Operation, Status

# Every case is read at this instant (the database's clock in production): expiry and leases
# are written relative to it, so cases do not age.
CASE_TIME = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class CaseAgent(_Strict):
    id: str = "test-agent"
    tenant: str = "test"


class CaseRequest(_Strict):
    method: str
    path: Annotated[str, Field(pattern=r"^/")]  # with the route prefix: /stripe/v1/refunds
    headers: dict[str, str] = Field(default_factory=dict)
    # At most one body: `form` (encoded in order), `json` (serialised), or `body` (raw text).
    form: dict[str, str] | None = None
    json_body: Any = Field(default=None, alias="json")
    body: str | None = None
    authenticated: bool = True  # false: no agent token is presented

    def sample(self, agent: Agent) -> SampleRequest:
        headers = dict(self.headers)
        raw = b""
        if self.form is not None:
            raw = urlencode(self.form).encode()
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif self.json_body is not None:
            raw = json.dumps(self.json_body).encode()
            headers.setdefault("Content-Type", "application/json")
        elif self.body is not None:
            raw = self.body.encode()
        return SampleRequest(
            self.method,
            self.path,
            tuple(headers.items()),
            raw,
            agent if self.authenticated else None,
        )


class CaseOperation(_Strict):
    """The operation row as the store would hold it; what is not written takes a default."""

    operation_id: str = "op_test"
    tenant: str | None = None  # default: the case agent's tenant
    agent_id: str | None = None  # None: any agent of the tenant
    provider: str | None = None  # default: the provider the request is routed to
    action: str
    path_params: dict[str, str] = Field(default_factory=dict)
    amount: int | None = None
    currency: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    idempotency_key: str = "opk_test"
    status: Status = Status.CREATED
    revoked: str | None = None  # the revocation reason; set: the approval is revoked
    expired: bool = False
    lease: Literal["live", "expired"] | None = None  # a dispatched attempt's lease
    last_outcome: LastOutcome | None = None
    response_status: int | None = None  # a settled operation's stored answer
    response_body: str | None = None
    # How long ago it was approved (a rule's preconditions are asked for past its
    # recheck_after_seconds), and the operation it supersedes (they are then always asked).
    approved_seconds_ago: Annotated[float, Field(ge=0)] = 300.0
    supersedes: str | None = None

    def row(self, policy: PolicySet, tenant: str, provider_hint: str | None) -> Operation:
        """The Operation the store would return; a rule it cannot name leaves path unrendered."""
        provider_name = self.provider or provider_hint or ""
        provider = policy.provider_named(provider_name)
        rule = provider.rule_named(self.action) if provider else None
        method, path = (rule.method, rule.path.render(self.path_params)) if rule else ("", "")
        fields: dict[str, Any] = {f.name: None for f in dataclasses.fields(Operation)}
        lease_until = {
            "live": CASE_TIME + timedelta(seconds=30),
            "expired": CASE_TIME - timedelta(seconds=1),
            None: None,
        }[self.lease]
        fields |= {
            "operation_id": self.operation_id,
            "tenant": self.tenant or tenant,
            "agent_id": self.agent_id,
            "provider": provider_name,
            "action": self.action,
            "method": method,
            "path": path,
            "path_params": dict(self.path_params),
            "amount": self.amount,
            "currency": self.currency.lower() if self.currency else None,
            "params": dict(self.params),
            "idempotency_key": self.idempotency_key,
            "approval_ref": "policy-test",
            "approved_by": "policy-test",
            "expires_at": CASE_TIME + timedelta(hours=-1 if self.expired else 1),
            "status": self.status,
            "revoked_at": CASE_TIME - timedelta(minutes=1) if self.revoked else None,
            "revoked_reason": self.revoked,
            "attempts": 0 if self.status is Status.CREATED else 1,
            "lease_until": lease_until,
            "last_outcome": self.last_outcome.value if self.last_outcome else None,
            "provider_status": self.response_status,
            "response_body": self.response_body.encode() if self.response_body else None,
            "reconcile_attempts": 0,
            # the one attempt of a dispatched case ended before a byte left, or may have landed
            "unsent_attempts": int(
                self.status is not Status.CREATED and self.last_outcome is LastOutcome.NOT_SENT
            ),
            "supersedes": self.supersedes,
            "created_at": CASE_TIME - timedelta(seconds=self.approved_seconds_ago),
            "updated_at": CASE_TIME - timedelta(seconds=self.approved_seconds_ago),
            "read_at": CASE_TIME,
        }
        known = {f.name for f in dataclasses.fields(Operation)}
        return Operation(**{k: v for k, v in fields.items() if k in known})


class CaseLookup(_Strict):
    """The provider's answer to a precondition lookup: a status and a JSON body (or a raw
    one), or ``error`` (the lookup failed or timed out: no answer at all)."""

    status: Annotated[int, Field(ge=100, le=599)] = 200
    json_body: Any = Field(default=None, alias="json")
    body: str | None = None
    error: str | None = None

    def answer(self) -> LookupAnswer:
        if self.error is not None:
            return Inconclusive(self.error)
        raw = self.body.encode() if self.body is not None else json.dumps(self.json_body).encode()
        return (self.status, raw)


class Expectation(_Strict):
    decision: Literal["allow", "deny", "replay"]
    reason: Reason | None = None  # for deny: the code
    would_deny: Reason | None = None  # shadow mode: the code an enforcing rule would give
    claim: ClaimKind | None = None  # for allow: first, resend or none (not compared if absent)


class Case(_Strict):
    name: Annotated[str, Field(min_length=1)]
    agent: CaseAgent = Field(default_factory=CaseAgent)
    request: CaseRequest
    operation: CaseOperation | None = None
    # Answers to the rule's precondition lookups, by path and query as opgate would ask
    # (e.g. /v1/charges/ch_1); without them a due precondition is not evaluated.
    lookups: dict[str, CaseLookup] = Field(default_factory=dict)
    expect: Expectation


class CasesFile(_Strict):
    version: Literal[1]
    cases: Annotated[list[Case], Field(min_length=1)]


@dataclass(frozen=True)
class CaseResult:
    file: str
    case: str
    passed: bool
    expected: str
    got: str
    explanation: Explanation


def case_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.glob("*" + TESTS_SUFFIX) if p.is_file())


def load_cases(path: Path) -> tuple[CasesFile | None, list[PolicyProblem]]:
    return parse_yaml_model(path.read_text("utf-8"), str(path), CasesFile)


def run_case(policy: PolicySet, case: Case, file: str = "") -> CaseResult:
    agent = Agent(agent_id=case.agent.id, tenant=case.agent.tenant)
    sample = case.request.sample(agent)
    rows: list[Operation] = []
    if case.operation is not None:
        route = policy.route(sample.path.partition("?")[0])
        hint = route.provider.provider if route else None
        rows.append(case.operation.row(policy, agent.tenant, hint))
    lookups = {path: lookup.answer() for path, lookup in case.lookups.items()}
    explanation = explain(policy, sample, rows, lookups)
    got = explanation.outcome()
    expect = case.expect
    passed = (
        got["decision"] == expect.decision
        and got["reason"] == (expect.reason.value if expect.reason else None)
        and got["would_deny"] == (expect.would_deny.value if expect.would_deny else None)
        and (expect.claim is None or got["claim"] == expect.claim.value)
    )
    return CaseResult(
        file, case.name, passed, _show(expect.model_dump(mode="json")), _show(got), explanation
    )


def run_cases(policy: PolicySet, cases: CasesFile, file: str = "") -> list[CaseResult]:
    return [run_case(policy, case, file) for case in cases.cases]


def _show(outcome: dict[str, Any]) -> str:
    parts = [str(outcome["decision"])]
    if outcome.get("reason"):
        parts.append(str(outcome["reason"]))
    if outcome.get("would_deny"):
        parts.append(f"would_deny={outcome['would_deny']}")
    if outcome.get("claim") and outcome["decision"] == "allow":
        parts.append(f"claim={outcome['claim']}")
    return " ".join(parts)


def render_table(results: list[CaseResult]) -> str:
    """A pass/fail line per case, then the totals."""
    width = max((len(r.case) for r in results), default=4)
    lines = []
    for r in results:
        mark = "PASS" if r.passed else "FAIL"
        line = f"{mark}  {Path(r.file).name}  {r.case:<{width}}  {r.got}"
        if not r.passed:
            line += f"  (expected {r.expected})"
        lines.append(line)
    failed = sum(not r.passed for r in results)
    lines.append(f"{len(results) - failed} passed, {failed} failed")
    return "\n".join(lines)
