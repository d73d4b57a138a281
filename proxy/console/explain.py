"""What the console tells a human in words, from the policy and an operation's or a proposal's
rows: a proposal as a sentence, what the policy checks, how each attempt and each lookup ended,
where to look at the provider, and what each verdict does. Pure: no IO, the values given."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from proxy.gate.lookup import LookupSubject, render_lookup
from proxy.policy.amounts import human_amount
from proxy.policy.model import Provider, Rule

_VERSION = re.compile(r"v[0-9]+")
# How an attempt ended (``LastOutcome``), said to the human who decides what happened.
_OUTCOME_WORDS = {
    "not_sent": "not sent: the connection never opened, no byte left",
    "unknown:timeout": "outcome unknown: no answer in time",
    "unknown:dropped": "outcome unknown: the connection dropped",
    "unknown:status": "outcome unknown: the provider answered {status}",
    "unknown:truncated": "outcome unknown: the answer was cut off",
    "confirmed": "confirmed: the provider answered {status}",
    "failed": "failed: the provider answered {status}, nothing happened",
}
# What a reconciliation lookup found (``lookup.describe``).
_RESULT_WORDS = {
    "found": "found it: the effect exists",
    "absent_conclusive": "not there, and the list is authoritative",
    "absent_inconclusive": "not there, but this list cannot prove it never happened",
}
# What each verdict does: the words beside the two buttons.
CONSEQUENCES = {
    "confirmed": (
        "The operation is confirmed with the provider object you name; the agent is told to "
        "proceed, and opgate never sends it again."
    ),
    "failed": (
        "The operation fails with no effect; the agent is told a new approval is required, and "
        "this one can never be sent again."
    ),
}


def action_words(action: str) -> str:
    """``refund.create`` -> "Refund", ``payment_intent.capture`` -> "Capture payment intent"."""
    noun, _, verb = action.partition(".")
    noun_words = noun.replace("_", " ")
    if not verb or verb == "create":
        return noun_words[:1].upper() + noun_words[1:]
    return f"{verb.replace('_', ' ').capitalize()} {noun_words}"


@dataclass(frozen=True)
class Sentence:
    """What the console says, in parts: its own words, and between them what others wrote
    (``quoted``: an agent's reason, a parameter's value, a name), which a page draws isolated
    (``<bdi>``) so that nothing quoted can reorder the console's words around it."""

    parts: tuple[tuple[str, bool], ...]

    def __str__(self) -> str:
        return "".join(text for text, _ in self.parts)


class _Words:
    """A sentence being built: ``say`` the console's words, ``quote`` the others'."""

    def __init__(self) -> None:
        self.parts: list[tuple[str, bool]] = []

    def say(self, text: str) -> _Words:
        self.parts.append((text, False))
        return self

    def quote(self, text: object) -> _Words:
        self.parts.append((str(text), True))
        return self

    def sentence(self) -> Sentence:
        return Sentence(tuple(self.parts))


def _subject(words: _Words, path_params: Mapping[str, str], params: Mapping[str, Any]) -> None:
    """The objects an operation names: " of charge ch_1, customer cus_1"."""
    named = [
        (name.replace("_", " "), value)
        for name, value in (*path_params.items(), *params.items())
        if isinstance(value, str | int) and not isinstance(value, bool)
    ]
    for index, (name, value) in enumerate(named):
        words.say((" of " if index == 0 else ", ") + name + " ").quote(value)


def subject_words(path_params: Mapping[str, str], params: Mapping[str, Any]) -> str:
    """The objects an operation names, as words: "of charge ch_1"."""
    words = _Words()
    _subject(words, path_params, params)
    return str(words.sentence()).removeprefix(" ")


def provider_words(provider: str) -> str:
    return provider[:1].upper() + provider[1:]


def proposal_said(proposal: Mapping[str, Any]) -> Sentence:
    """ "Refund 25.00 USD of charge ch_1 at Stripe, asked by demo-agent (tenant demo): why"."""
    words = _Words().say(action_words(proposal["action"]))
    if proposal["amount"] is not None:
        words.say(
            " " + human_amount(proposal["amount"], proposal["currency"], with_minor_units=True)
        )
    _subject(words, proposal["target"]["path_params"], proposal["params"])
    words.say(f" at {provider_words(proposal['provider'])}, asked by ").quote(proposal["agent_id"])
    words.say(" (tenant ").quote(proposal["tenant"]).say("): ").quote(proposal["reason"])
    return words.sentence()


def proposal_sentence(proposal: Mapping[str, Any]) -> str:
    """The proposal's sentence as plain text (``proposal_said``)."""
    return str(proposal_said(proposal))


def operation_said(op: Mapping[str, Any]) -> Sentence:
    """ "Refund 5.00 USD of charge ch_1 at Stripe, approved by alice (INC-1)"."""
    words = _Words().say(action_words(op["action"]))
    if op["amount"] is not None:
        words.say(" " + human_amount(op["amount"], op["currency"], with_minor_units=True))
    _subject(words, op["target"]["path_params"], op["params"])
    approval = op["approval"]
    words.say(f" at {provider_words(op['provider'])}, approved by ").quote(approval["approved_by"])
    return words.say(" (").quote(approval["ref"]).say(")").sentence()


def operation_sentence(op: Mapping[str, Any]) -> str:
    """The operation's sentence as plain text (``operation_said``)."""
    return str(operation_said(op))


def policy_checks(
    provider: Provider, rule: Rule, amount: int | None, currency: str | None
) -> list[str]:
    """What opgate checks of the request an approval lets through, one sentence each."""
    checks = [f"only {rule.method} {rule.path.text} at {provider.upstream} matches this rule"]
    if rule.amount is not None:
        if amount is None:
            checks.append(f"{rule.amount} must be absent (no amount was asked for)")
        else:
            checks.append(
                f"{rule.amount} must be exactly "
                + human_amount(amount, currency, with_minor_units=True)
            )
    if rule.params:
        checks.append(
            f"these must equal the approved values or be absent: {', '.join(rule.params)}"
        )
    if rule.free:
        checks.append(f"the agent may set only these besides: {', '.join(rule.free)}")
    else:
        checks.append("the agent may set nothing else")
    if rule.send_key and provider.idempotency.header is not None:
        checks.append(
            f"sent once, with opgate's {provider.idempotency.header}; a re-send only as opgate "
            "decides"
        )
    if rule.preconditions is not None:
        for lookup in rule.preconditions.lookups:
            checks.append(
                f"before the first send, {lookup.path} at the provider must show: "
                + "; ".join(lookup.require)
            )
    return checks


def attempts(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each attempt and how it ended, from the operation's events (one line per attempt)."""
    found: dict[int, dict[str, Any]] = {}
    for event in events:
        detail = event["detail"]
        number = detail.get("attempt") if isinstance(detail, dict) else None
        if not isinstance(number, int):
            continue
        line = found.setdefault(number, {"attempt": number, "at": event["at"], "ended": None})
        if event["event"] == "claimed":
            line["at"] = event["at"]
            continue
        outcome = detail.get("outcome", event["event"])
        status = detail.get("provider_status")
        words = _OUTCOME_WORDS.get(str(outcome), str(outcome))
        line["ended"] = words.format(status=status if status is not None else "nothing")
    for line in found.values():
        if line["ended"] is None:
            line["ended"] = "no end recorded yet: in flight, or its end was lost"
    return [found[n] for n in sorted(found)]


def lookup_tries(
    events: Sequence[Mapping[str, Any]], kinds: frozenset[str]
) -> list[dict[str, Any]]:
    """Each reconciliation try once (the event that recorded it), with what each lookup found."""
    tries = []
    for event in events:
        if event["event"] not in kinds or not isinstance(event["detail"], dict):
            continue
        detail = event["detail"]
        tries.append(
            {
                "try": detail.get("try"),
                "at": event["at"],
                "event": event["event"],
                "by": event["actor"],
                "lookups": [
                    {"path": lookup.get("path", ""), "found": result_words(lookup.get("result"))}
                    for lookup in detail.get("lookups", [])
                    if isinstance(lookup, dict)
                ],
            }
        )
    return tries


def result_words(result: object) -> str:
    text = str(result)
    if text in _RESULT_WORDS:
        return _RESULT_WORDS[text]
    if text.startswith("inconclusive: "):
        return "could not tell: " + text.removeprefix("inconclusive: ")
    return text


def searches(provider: Provider, rule: Rule | None, op: LookupSubject) -> list[dict[str, str]]:
    """What a human searches for at the provider to learn whether the operation happened: each
    declared lookup as its search ("refunds with metadata.operation_id = op_1") and its exact
    request; without lookups, the operation id where opgate wrote it."""
    found = []
    if rule is not None and rule.reconcile is not None:
        for lookup in rule.reconcile.lookups:
            target = render_lookup(lookup, op)
            if target is None:
                continue
            field = lookup.match.strip("/").replace("/", ".")
            found.append(
                {
                    "search": f"{_collection(lookup.path)} with {field} = {op.operation_id}",
                    "request": f"GET {target}",
                }
            )
    if not found and rule is not None:
        where = provider.metadata_field(rule)
        if where is not None:
            found.append({"search": f"an object whose {where} is {op.operation_id}", "request": ""})
    return found


class SearchSubject(LookupSubject, Protocol):
    """What a search by the approved values reads: an operation."""

    @property
    def amount(self) -> int | None: ...
    @property
    def currency(self) -> str | None: ...
    @property
    def idempotency_key(self) -> str: ...


def value_searches(provider: Provider, rule: Rule, op: SearchSubject) -> list[dict[str, str]]:
    """What a human searches for where the provider was never sent the operation id (no
    lookup, no metadata field): the object the rule makes with the approved values, around the
    attempts' times, and the request by the idempotency key, where it was sent."""
    values = [f"{name} = {value}" for name, value in {**op.path_params, **op.params}.items()]
    if op.amount is not None:
        values.insert(0, human_amount(op.amount, op.currency, with_minor_units=True))
    shown = ", ".join(values) or "the approved values"
    made = "made around the attempts' times (opgate did not send it its operation id)"
    what = f"the effect of {rule.method} {rule.path.text}"
    found = [{"search": f"{what} with {shown}, {made}", "request": ""}]
    header = provider.key_header(rule)
    if header is not None:
        found.append(
            {"search": f"a request sent with {header} = {op.idempotency_key}", "request": ""}
        )
    return found


def looks_up(rule: Rule | None) -> bool:
    """Whether opgate still looks the provider up for an operation of ``rule`` on its own."""
    return rule is not None and rule.reconcile is not None and bool(rule.reconcile.lookups)


def verdict(op: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """How a settled operation was settled, for the top of its page: a human's verdict (who,
    when, the note, the object named) or what opgate learned; None while it is unsettled."""
    if op["status"] not in ("confirmed", "failed"):
        return None
    words = "It happened" if op["status"] == "confirmed" else "It did not happen"
    for event in reversed(events):
        detail = event["detail"] if isinstance(event["detail"], dict) else {}
        if event["event"] == "resolved":
            return {
                "words": words,
                "status": op["status"],
                "by": event["actor"],
                "at": event["at"],
                "note": detail.get("note") or None,
                "object_id": detail.get("object_id"),
            }
        if event.get("to_status") == op["status"]:
            return {
                "words": words,
                "status": op["status"],
                "by": event["actor"],
                "at": event["at"],
                "note": None,
                "object_id": (op.get("provider_response") or {}).get("object_id"),
            }
    return None


def _collection(path: str) -> str:
    """The objects a list path returns: /v2/payments -> payments, /v1/charges/search ->
    charges."""
    names = [p for p in path.split("/") if p and "{" not in p and not _VERSION.fullmatch(p)]
    names = [n for n in names if n != "search"] or ["objects"]
    return names[-1].replace("_", " ")


def dashboard_url(provider: Provider, op: LookupSubject) -> str | None:
    """The provider's dashboard search for ``op`` (policy ``dashboard_search_url``), each value
    URL-quoted; None without a template, or if it names a value the operation lacks."""
    template = provider.dashboard_search_url
    if template is None:
        return None
    values = {
        **{k: str(v) for k, v in op.params.items()},
        **op.path_params,
        "operation_id": op.operation_id,
    }
    try:
        return template.format_map({k: quote(v, safe="") for k, v in values.items()})
    except (KeyError, ValueError, IndexError):
        return None
