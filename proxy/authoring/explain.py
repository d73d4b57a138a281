"""Why opgate would decide a request the way it does: the matched rule, every check, the verdict.

Pure. A request written down (``SampleRequest``) goes through the functions the pipeline runs on
a live one (``proxy.gate.intake``: identify, body, facts, operation reference;
``proxy.gate.checks``: ``evaluate``), so an explanation cannot drift from what the proxy does.
Used by ``opgate policy explain``, ``opgate policy test`` and ``POST /v1/explain``.

The rule's preconditions are their own stage, after the checks: when a recheck is due, the
lookup answers are taken from ``lookups`` (a test case gives them, keyed by the lookup's path
and query); without an answer for every lookup the stage is shown as not evaluated.

What it does not cover: the steps after the decision that need the outside world (the provider
credential, the claim's race with another replica, the provider's answer).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.gate.bodies import ParsedBody
from proxy.gate.checks import Agent, Verdict, evaluate
from proxy.gate.decision import ClaimKind, Decision, Deny, Forward, Replay
from proxy.gate.identity import AgentDirectory, token_digest
from proxy.gate.intake import (
    Target,
    identify_request,
    operation_reference,
    parse_request_body,
    refuse_before_reading,
    request_facts,
    with_body_key,
)
from proxy.gate.preconditions import (
    Checked,
    LookupAnswer,
    judge,
    planned_lookups,
    precondition_refusal,
    recheck_due,
)
from proxy.gate.reasons import REASONS
from proxy.observe.audit import Decision as AuditDecision
from proxy.policy.model import Mode
from proxy.policy.set import PolicySet
from proxy.store.operation import Operation

EXPLAIN_AGENT = Agent(agent_id="explain", tenant="explain")


@dataclass(frozen=True)
class SampleRequest:
    """An agent request as written in a test case or given to explain."""

    method: str
    path: str  # as the agent sends it: route prefix, path and query, e.g. /stripe/v1/refunds
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    # The request comes from this agent (an opgate token of its own is added), or from nobody.
    agent: Agent | None = EXPLAIN_AGENT

    def with_header_default(self, name: str, value: str) -> SampleRequest:
        """This request with ``name`` added unless it already carries it."""
        if any(key.lower() == name.lower() for key, _ in self.headers):
            return self
        return SampleRequest(
            self.method, self.path, (*self.headers, (name, value)), self.body, self.agent
        )


Admitted = tuple[Target, ParsedBody]  # stage 1 passed: the target and its parsed body


@dataclass(frozen=True)
class PreconditionStage:
    """The rule's preconditions for this request: why they were due, and their verdict on the
    answers given (None: not evaluated, ``missing`` lookups had no answer)."""

    trigger: str
    checked: Checked | None
    missing: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        checked = self.checked
        result = "not evaluated" if checked is None else type(checked).__name__.lower()
        return {
            "trigger": self.trigger,
            "result": result,
            "missing_answers": list(self.missing),
            "evidence": checked.evidence if checked is not None else None,
        }


@dataclass(frozen=True)
class Explanation:
    policy_version: str
    target: Target | None  # None when the request was refused before a rule matched
    refused_at: str | None  # "identify" or "body" when refused before the checks
    operation: Operation | None
    verdict: Verdict | None
    decision: Decision
    preconditions: PreconditionStage | None = None  # None: none were due

    def outcome(self) -> dict[str, Any]:
        """The decision in the audit record's words: decision, reason, would_deny, claim."""
        return describe(self.decision)

    def to_json(self) -> dict[str, Any]:
        target, op, verdict = self.target, self.operation, self.verdict
        return {
            "policy_version": self.policy_version,
            "provider": target.provider.provider if target else None,
            "rule": target.rule.name if target else None,
            "path_params": target.path_params if target else None,
            "mode": verdict.mode.value if verdict else None,
            "refused_at": self.refused_at,
            "operation_id": op.operation_id if op else None,
            "operation_status": op.status.value if op else None,
            "checks": [
                {
                    "check": result.check,
                    "result": "pass"
                    if result.denied is None
                    else ("fail (report mode)" if result.relaxed else "fail"),
                    "reason": result.denied.reason.value if result.denied else None,
                    "detail": result.denied.detail if result.denied else None,
                }
                for result in (verdict.results if verdict else ())
            ],
            "state": describe(verdict.state) if verdict and verdict.state else None,
            "preconditions": self.preconditions.to_json() if self.preconditions else None,
            **self.outcome(),
        }


def describe(decision: Decision) -> dict[str, Any]:
    if isinstance(decision, Deny):
        return {
            "decision": AuditDecision.DENY,
            "reason": decision.reason.value,
            "status": REASONS[decision.reason].status,
            "detail": decision.detail,
            "would_deny": None,
            "claim": None,
        }
    return {
        "decision": AuditDecision.REPLAY if isinstance(decision, Replay) else AuditDecision.ALLOW,
        "reason": None,
        "status": None,
        "detail": None,
        "would_deny": decision.would_deny.reason.value if decision.would_deny else None,
        "claim": decision.claim.value if isinstance(decision, Forward) else None,
    }


def explain(
    policy: PolicySet,
    sample: SampleRequest,
    rows: Iterable[Operation] = (),
    lookups: Mapping[str, LookupAnswer] | None = None,
) -> Explanation:
    """Decide ``sample`` against ``policy``; ``rows`` stand in for the operation store and
    ``lookups`` for the provider's answers to precondition lookups (by path and query)."""
    front = admit(policy, sample)
    if isinstance(front, Explanation):
        return front
    target, _ = front
    reference = operation_reference(target)
    op = next((row for row in rows if reference and reference.names(row)), None)
    return conclude(policy, front, op, lookups)


def admit(policy: PolicySet, sample: SampleRequest) -> Admitted | Explanation:
    """Identify and read the body, as the pipeline's stage 1 does; a refusal is final."""
    agents, headers = _authenticated(sample)
    target = identify_request(policy, agents, sample.method.upper(), sample.path, headers)
    if isinstance(target, Deny):
        return Explanation(policy.version, None, "identify", None, None, target)
    refused = refuse_before_reading(target, len(sample.body))
    body = refused or parse_request_body(target, sample.body)
    if isinstance(body, Deny):
        return Explanation(policy.version, target, "body", None, None, body)
    keyed = with_body_key(target, body)
    if isinstance(keyed, Deny):
        return Explanation(policy.version, target, "body", None, None, keyed)
    return keyed, body


def conclude(
    policy: PolicySet,
    admitted: Admitted,
    op: Operation | None,
    lookups: Mapping[str, LookupAnswer] | None = None,
) -> Explanation:
    target, body = admitted
    verdict = evaluate(
        request_facts(target, body),
        op,
        operation_lookup_failed=target.named_operation_id is not None,
    )
    decision = verdict.decision
    stage = None
    trigger = recheck_due(target.rule, op) if op is not None else None
    if op is not None and trigger is not None and isinstance(decision, Forward):
        stage = _preconditions(target, op, trigger, lookups or {})
        deny = precondition_refusal(stage.checked) if stage.checked is not None else None
        if deny is not None and target.provider.mode_for(target.rule) is Mode.REPORT:
            decision = replace(decision, would_deny=decision.would_deny or deny)
        elif deny is not None:
            decision = deny
    return Explanation(policy.version, target, None, op, verdict, decision, stage)


def _preconditions(
    target: Target, op: Operation, trigger: str, lookups: Mapping[str, LookupAnswer]
) -> PreconditionStage:
    """The pipeline's precondition stage on answers given instead of asked for."""
    planned = planned_lookups(target.rule, op)
    missing = tuple(t for _, t in planned if t is not None and t not in lookups)
    if missing:
        return PreconditionStage(trigger, None, missing)
    return PreconditionStage(trigger, judge(trigger, op, planned, lookups))


def _authenticated(sample: SampleRequest) -> tuple[AgentDirectory, CIMultiDictProxy[str]]:
    """An agent directory holding only the sample's agent, and its token in the headers."""
    headers = CIMultiDict(sample.headers)
    if sample.agent is None:
        return AgentDirectory({}), CIMultiDictProxy(headers)
    token = "opg_explain_" + secrets.token_hex(8)
    headers.add("Proxy-Authorization", f"Bearer {token}")
    return AgentDirectory({token_digest(token): sample.agent}), CIMultiDictProxy(headers)


def render_text(explanation: Explanation) -> str:
    """The explanation for a terminal, one fact per line."""
    data = explanation.to_json()
    lines = [f"policy version: {data['policy_version']}"]
    if data["rule"]:
        lines.append(
            f"rule: {data['provider']} {data['rule']} (path parameters {data['path_params']})"
        )
        if data["mode"]:
            lines.append(f"mode: {data['mode']}")
    if data["refused_at"]:
        lines.append(f"refused at: {data['refused_at']}")
    if data["operation_id"]:
        lines.append(f"operation: {data['operation_id']} ({data['operation_status']})")
    elif explanation.verdict is not None and explanation.target is not None:
        lines.append("operation: none found")
    if data["checks"]:
        lines.append("checks:")
        for check in data["checks"]:
            why = f" {check['reason']}: {check['detail']}" if check["reason"] else ""
            lines.append(f"  {check['result']:<18} {check['check']}{why}")
    if data["state"]:
        state = data["state"]
        lines.append(f"state: {state['decision']} {state['reason'] or state['claim'] or ''}")
    if data["preconditions"]:
        lines.extend(_precondition_lines(data["preconditions"]))
    lines.append(f"decision: {_summary(data)}")
    return "\n".join(lines)


def _precondition_lines(stage: dict[str, Any]) -> list[str]:
    lines = [f"preconditions: due ({stage['trigger']}), {stage['result']}"]
    for path in stage["missing_answers"]:
        lines.append(f"  no answer given for {path}")
    for lookup in (stage["evidence"] or {}).get("lookups", []):
        lines.append(f"  lookup {lookup['path']}: {lookup.get('provider_status', '')}".rstrip())
        if "skipped" in lookup or "error" in lookup:
            lines.append(f"    {lookup.get('skipped') or lookup.get('error')}")
        for assertion in lookup.get("assertions", []):
            held = assertion.get("held")
            mark = (
                "skipped"
                if "skipped" in assertion
                else {True: "holds", False: "fails"}.get(held, "unevaluable")
            )
            values = json.dumps(assertion["values"], sort_keys=True)
            lines.append(f"    {mark:<11} {assertion['require']}  {values}")
    return lines


def _summary(data: dict[str, Any]) -> str:
    if data["decision"] == AuditDecision.DENY:
        return f"deny {data['reason']} ({data['status']}): {data['detail']}"
    text = str(data["decision"])
    if data["claim"] and data["claim"] != ClaimKind.NONE:
        text += f" (claim: {data['claim']})"
    if data["would_deny"]:
        text += f", would deny {data['would_deny']} in enforce mode"
    return text
