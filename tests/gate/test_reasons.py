"""The rejection codes are a public contract: every one is described and documented."""

from __future__ import annotations

from proxy.gate.reasons import REASONS, Reason
from tests.support.paths import REPO


def test_every_reason_has_a_status_title_and_next_action() -> None:
    """No code can be produced without the sentence an agent needs."""
    assert set(REASONS) == set(Reason)
    for info in REASONS.values():
        assert 400 <= info.status <= 599
        assert info.title
        assert info.next_action


def test_every_reason_is_documented_in_the_codes_reference() -> None:
    """The codes reference (docs/reference/codes.md) lists every code the proxy can answer with."""
    text = (REPO / "docs" / "reference" / "codes.md").read_text()
    missing = [reason.value for reason in Reason if f"| `{reason.value}` |" not in text]
    assert missing == []
