"""storable.py and the record's path, pure: whatever a request puts in a record, what is stored
is valid UTF-8 without NUL, and a path is bounded."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.observe.audit import AuditRecord, request_path
from proxy.observe.auditlog.records import record_text
from proxy.observe.auditlog.storable import PATH_LIMIT_BYTES, bounded_path, storable

# Every code point, surrogates included (what a pure-Python HTTP parser makes of bad bytes).
ANY_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF))
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@given(VALUES)
def test_every_string_of_a_storable_value_is_utf8_without_nul(value: Any) -> None:
    """Any nesting of any strings: after storable, each encodes as UTF-8 and holds no NUL, and
    the stored JSON holds no escape PostgreSQL refuses; applying it twice changes nothing."""
    made = storable(value)
    for text in _strings(made):
        text.encode("utf-8")
        assert "\x00" not in text
    stored = record_text({"v": value})
    assert "\\u0000" not in stored
    # escaped surrogate pairs (a character beyond the BMP) are fine; a lone one is not
    for text in _strings(json.loads(stored)):
        text.encode("utf-8")
    assert storable(made) == made


def test_nul_and_lone_surrogates_become_the_replacement_character() -> None:
    """They are replaced, not dropped: the record says something was there."""
    assert storable({"p\x00": ["/a\x00", "b\udcff", "ok é"]}) == {
        "p\ufffd": ["/a\ufffd", "b\ufffd", "ok é"]
    }


@pytest.mark.parametrize(
    ("scenario", "raw_target", "path"),
    [
        ("origin-form with a query", "/v1/a%2Fb?x=%00", "/v1/a%2Fb"),
        ("a percent-encoded NUL stays encoded", "/x%00", "/x%00"),
        ("absolute-form", "http://h.test:8080/p%00x?q", "/p%00x"),
        ("absolute-form without a path", "http://h.test", "/"),
        ("not a path at all", "h.test:443", "h.test:443"),
    ],
)
def test_the_recorded_path_is_the_raw_path_without_query(
    scenario: str, raw_target: str, path: str
) -> None:
    """The path as the agent sent it, never decoded."""
    assert request_path(raw_target) == path


@given(ANY_TEXT)
def test_a_bounded_path_is_at_most_the_limit_and_names_the_whole(path: str) -> None:
    """A cut path is a prefix of the path, at most 512 UTF-8 bytes, with the whole path's
    SHA-256; an uncut one is the path itself with no digest."""
    kept, digest = bounded_path(path)
    assert path.startswith(kept)
    assert len(kept.encode("utf-8", "surrogatepass")) <= PATH_LIMIT_BYTES
    if digest is None:
        assert kept == path
    else:
        assert digest == hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()


def test_a_records_fields_carry_the_bounded_path_and_its_digest() -> None:
    """AuditRecord.fields() is where the cut happens, for every listener alike."""
    long_path = "/" + "x" * 600
    fields = AuditRecord(request_id="r", path=long_path).fields()
    assert fields["path"] == long_path[:PATH_LIMIT_BYTES]
    assert fields["path_sha256"] == hashlib.sha256(long_path.encode()).hexdigest()
    assert json.loads(record_text(fields))["path"] == fields["path"]
