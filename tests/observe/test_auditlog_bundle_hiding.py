"""Hiding never widens (proxy/observe/auditlog/bundle.py): a valid bundle (minted by
tests/support/bundles.py, apart from the verifier) presented with records withheld, trimmed,
reordered, duplicated, moved between its lists or marked unproven, its stream's end or answer
or a signature withheld, or an unsigned window set: each presentation is refused, or verifies
saying exactly what the whole one says of the operation (it may only say less of what the
records it may leave out show: replays, a stored answer's match)."""

from __future__ import annotations

import copy
import random
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.observe.auditlog import bundle
from proxy.transparency import note
from tests.support.bundles import MINTED_OPERATION, mint_bundle
from tests.support.transparency import LOG_SIGNER, WITNESS_SIGNER

LOG = LOG_SIGNER.verifier().vkey()
WITNESS = WITNESS_SIGNER.verifier().vkey()
FULL = mint_bundle(replays=2, after_checkpoint=1)
# what the reviewer relies on: who approved it, how often it was sent, how it was settled
DECISIVE = ("approved by", "sent ", "never sent", "answered ", "settled ", "not settled")
LISTS = ("records", "referenced")

Edit = tuple[str, str, int]
edits = st.lists(
    st.tuples(
        st.sampled_from(
            (
                "drop",
                "duplicate",
                "move",
                "unprove",
                "shuffle",
                "trim",
                "since",
                "drop_end",
                "drop_end_head",
                "drop_answer",
                "drop_signature",
                "no_operation",
            )
        ),
        st.sampled_from(LISTS),
        st.integers(min_value=0, max_value=20),
    ),
    min_size=1,
    max_size=4,
)


def present(whole: dict[str, Any], changes: list[Edit]) -> dict[str, Any]:
    """The bundle as a presenter who chooses what to show would hand it over."""
    shown = copy.deepcopy(whole)
    for change, name, n in changes:
        items: list[Any] = shown[name]
        other = shown["referenced" if name == "records" else "records"]
        index = n % len(items) if items else 0
        if change == "drop" and items:
            del items[index]
        elif change == "duplicate" and items:
            items.insert(n % (len(items) + 1), copy.deepcopy(items[index]))
        elif change == "move" and items:
            other.append(items.pop(index))
        elif change == "unprove" and items:
            items[index].update(leaf_index=None, inclusion=None)
        elif change == "shuffle":
            random.Random(n).shuffle(items)
        elif change == "trim":
            items.sort(key=lambda e: (e["stream"], e["seq"]))
            del items[len(items) - 1 - n % max(len(items), 1) :]
        elif change == "since":
            shown["since"] = "1970-01-01T00:00:00+00:00"
        elif change == "drop_end":
            shown["ends"].pop(MINTED_OPERATION, None)
        elif change == "drop_end_head" and shown["ends"].get(MINTED_OPERATION, {}).get("heads"):
            shown["ends"][MINTED_OPERATION]["heads"].pop()
        elif change == "drop_answer":
            shown["answers"] = {}
        elif change == "drop_signature":
            lines = shown["checkpoint"].splitlines(keepends=True)
            shown["checkpoint"] = "".join(lines[: -1 - n % 2] + lines[len(lines) - n % 2 :])
        elif change == "no_operation":
            shown["operation_id"] = None
    return shown


def kind(line: str) -> str:
    return " ".join(line.split()[:2])


def number(line: str) -> int:
    """The first count a line gives (replayed at least N times, N records), or 0."""
    return next((int(word) for word in line.replace("(", " ").split() if word.isdigit()), 0)


def said(report: bundle.BundleReport) -> dict[str, list[str]]:
    return {found.operation_id: found.lines for found in report.operations}


WHOLE = bundle.verify(FULL, LOG, [WITNESS])


def test_the_whole_bundle_verifies() -> None:
    """The minted bundle verifies, and says the operation was sent twice."""
    assert WHOLE.breaks == []
    [lines] = said(WHOLE).values()
    assert lines[1].startswith("sent 2 times (2 attempts)")


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits)
def test_hiding_never_widens(changes: list[Edit]) -> None:
    """Refused, or the same decisive lines as the whole bundle and no line it does not say."""
    try:
        report = bundle.verify(present(FULL, changes), LOG, [WITNESS])
    except bundle.BundleError:
        event("refused as unreadable")
        return
    if report.breaks:
        event("refused as broken")
        return
    event("verified")
    whole, shown = said(WHOLE), said(report)
    for operation_id, lines in shown.items():
        # what the records it may leave out show (replays, the holders of the answer's
        # digest) it may say of fewer records, never of another kind
        kinds = {kind(line): line for line in whole[operation_id]}
        for line in lines:
            assert kind(line) in kinds, changes
            assert number(line) <= number(kinds[kind(line)]), changes
        decisive = [line for line in whole[operation_id] if line.startswith(DECISIVE)]
        assert [line for line in lines if line.startswith(DECISIVE)] == decisive, changes


def test_the_reviewers_witnesses_are_counted_by_name() -> None:
    """Every witness the reviewer names must have cosigned (no --quorum): a witness named by
    two keys (its rotated key and its old one) is one witness; another witness named that did
    not cosign fails the bundle, whatever ``quorum`` the bundle says."""
    rotated = note.Signer.generate(WITNESS_SIGNER.name, note.COSIGNATURE_V1).verifier().vkey()
    assert bundle.verify(FULL, LOG, [WITNESS, rotated]).breaks == []
    other = note.Signer.generate("w2.test", note.COSIGNATURE_V1).verifier().vkey()
    assert bundle.verify(dict(FULL, quorum=0), LOG, [WITNESS, other]).breaks == [
        "checkpoint: cosigned by 1 of the 2 witnesses given, 2 needed"
    ]
    assert bundle.verify(FULL, LOG, [WITNESS, other], quorum=1).breaks == []
