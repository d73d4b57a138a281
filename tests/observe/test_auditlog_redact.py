"""redact.py, pure: whatever a record holds, its redaction applies the two rules (sensitive keys,
known secret values) exactly as they read, the fast path for flat records included."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.observe.auditlog.redact import REDACTED, Redactor

SECRETS = ("sk_test_secret_value", "whsec_0123456789")
KEYS = st.sampled_from(["path", "Authorization", "api-key", "card", "reason", "x"]) | st.text()
TEXTS = st.sampled_from([*SECRETS, "a sk_test_secret_value b", "plain", ""]) | st.text()
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXTS
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=8,
)


def _by_the_rules(value: Any, redactor: Redactor) -> Any:
    if isinstance(value, str):
        for secret in sorted(SECRETS, key=len, reverse=True):
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {
            k: REDACTED if redactor.is_sensitive(str(k)) else _by_the_rules(v, redactor)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_by_the_rules(v, redactor) for v in value]
    return value


@given(st.dictionaries(KEYS, VALUES, max_size=8))
def test_a_redacted_record_is_what_the_two_rules_make_of_it(record: dict[str, Any]) -> None:
    """Sensitive keys' values become [REDACTED] and every known secret is cut out of every
    string, at any depth; a record without either comes back equal (and as a copy)."""
    redactor = Redactor(["card"], secrets=SECRETS)
    redacted = redactor.mapping(record)
    assert redacted == _by_the_rules(record, redactor)
    assert redacted is not record


def test_a_secret_in_any_string_value_of_a_flat_record_is_cut_out() -> None:
    """The flat-record shortcut looks for every secret in every string value."""
    redactor = Redactor(secrets=SECRETS)
    record = {"a": "ok", "b": 1, "c": None, "d": "x whsec_0123456789 y", "e": "ok too"}
    assert redactor.mapping(record) == {**record, "d": f"x {REDACTED} y"}
