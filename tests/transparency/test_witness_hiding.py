"""Hiding never widens, for a witness (proxy/transparency/witness.py): an ``add-checkpoint``
request minted valid (tests/support/transparency.py, apart from the verifier), then presented
with proof lines or signature lines withheld, trimmed, reordered or duplicated, is refused, or
cosigned exactly as the whole one (the same checkpoint)."""

from __future__ import annotations

import base64
import random

from hypothesis import event, given, settings
from hypothesis import strategies as st

from proxy.transparency import note
from proxy.transparency.witness import Cosigned, Refusal, decide, parse_add_checkpoint
from tests.support.transparency import (
    LOG_SIGNER,
    ORIGIN,
    UNKNOWN_SIGNER,
    consistency,
    leaf,
    mth,
)

LOGS = {ORIGIN: [LOG_SIGNER.verifier()]}


def minted(old: int, new: int) -> tuple[list[str], list[str], Cosigned | None]:
    """(proof lines, signed checkpoint lines, what the witness last cosigned) of a valid
    request that grows the log from ``old`` to ``new`` leaves."""
    leaves = [leaf(bytes([n % 256, n // 256])) for n in range(new)]
    text = f"{ORIGIN}\n{new}\n{base64.b64encode(mth(leaves)).decode()}\n"
    signed = note.sign_note(text, [LOG_SIGNER, UNKNOWN_SIGNER])
    proof = [base64.b64encode(p).decode() for p in consistency(old, leaves)]
    latest = Cosigned(old, mth(leaves[:old])) if old else None
    return proof, signed.splitlines(keepends=True), latest


def body(old: int, proof: list[str], checkpoint: list[str]) -> bytes:
    return (f"old {old}\n" + "".join(f"{p}\n" for p in proof) + "\n" + "".join(checkpoint)).encode()


def decided(request: bytes, latest: Cosigned | None) -> object:
    try:
        return decide(parse_add_checkpoint(request), LOGS, latest)
    except Refusal as refusal:
        return refusal.status


edit = st.tuples(
    st.sampled_from(("drop", "duplicate", "shuffle", "trim")),
    st.sampled_from(("proof", "signatures")),
    st.integers(min_value=0, max_value=70),
)


@settings(max_examples=1000, deadline=None)
@given(st.integers(min_value=1, max_value=40), st.data())
def test_a_hidden_part_never_widens_what_a_witness_cosigns(new: int, data: st.DataObject) -> None:
    """Refused (a status), or the same checkpoint as the whole request."""
    old = data.draw(st.integers(min_value=0, max_value=new))
    proof, checkpoint, latest = minted(old, new)
    whole = decided(body(old, proof, checkpoint), latest)
    assert not isinstance(whole, int), whole
    text_lines = checkpoint[: checkpoint.index("\n") + 1]
    signatures = checkpoint[len(text_lines) :]
    for change, part, n in data.draw(st.lists(edit, min_size=1, max_size=3)):
        items = proof if part == "proof" else signatures
        if not items:
            continue
        if change == "drop":
            del items[n % len(items)]
        elif change == "duplicate":
            items.insert(n % (len(items) + 1), items[n % len(items)])
        elif change == "shuffle":
            random.Random(n).shuffle(items)
        else:
            del items[len(items) - 1 - n % len(items) :]
    shown = decided(body(old, proof, text_lines + signatures), latest)
    event(f"refused {shown}" if isinstance(shown, int) else "cosigned")
    assert isinstance(shown, int) or shown == whole
