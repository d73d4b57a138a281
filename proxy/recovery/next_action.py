"""The recovery protocol a replacement agent follows: one pure function from the authoritative
row to what it may do next. The agent's memory and judgement are not inputs.

    proceed                confirmed: record the provider's answer and move on
    send                   created, approval stands: nothing was sent yet; send exactly it
    wait                   an attempt (or a reconciliation) is in flight: ask again later
    retry                  unknown outcome, nothing in flight, approval stands, and either
                           nothing was sent or the provider still deduplicates the key (within
                           its retention): re-send the identical request (opgate uses the same
                           key, and asks the provider first where the rule declares lookups)
    reconcile              unknown outcome and a re-send could duplicate (or the approval no
                           longer stands): opgate asks the provider, at the rule's pace;
                           ask again after ``retry_after_seconds``
    new_approval_required  failed with no effect (or never sent and no longer approved, or
                           never sent because the rule's preconditions no longer held at the
                           provider, before its first send or before a re-send after attempts
                           that never left: ``evidence`` says what the lookup showed): a new
                           attempt needs a new approved operation that supersedes this one
    escalated              a human must decide

An operation that opgate's database may have lost a claim of (``lookup_before_send``: it was
created or dispatched when a failover switched the database's timeline) is never told plain
``send``: it is told ``retry`` (re-send the identical request; opgate asks the provider first,
replays the effect if the lost timeline sent it, and sends only if the provider conclusively
has none; a rule without lookups escalates it instead), or ``wait`` while that lookup is not
due yet.
"""

from __future__ import annotations

from typing import Any

from proxy.gate.transitions import Advice, ClaimRule, NextAction, advice, transition
from proxy.store.operation import Operation

__all__ = ["Advice", "NextAction", "next_action"]


def next_action(
    op: Operation, rule: ClaimRule, precondition_failure: dict[str, Any] | None = None
) -> Advice:
    """``rule``: what the provider and the operation's rule can do for a re-send (its
    deduplication window, its lookups). ``precondition_failure``: the evidence of the latest
    failed precondition of an operation of which nothing has left (its
    ``precondition_failed`` event since its last claim), if any. The transition is decided in
    proxy/gate/transitions.py, as the gate decides it; where the advice differs from what the
    gate would do, that module says why."""
    return advice(transition(op, rule), op, rule, precondition_failure)
