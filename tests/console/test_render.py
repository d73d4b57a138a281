"""The console's rendering helpers, pure."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.console.render import MAX_COMBINING_RUN, money, pretty, visible

# every bidirectional control of UAX #9 (embeddings, overrides, isolates, marks)
BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


@pytest.mark.parametrize(
    ("minor_units", "currency", "shown"),
    [
        pytest.param(8200000, "usd", "82000.00 USD (8200000 minor units)", id="two decimals"),
        pytest.param(500, "jpy", "500 JPY", id="no decimals"),
        pytest.param(1234, "kwd", "1.234 KWD (1234 minor units)", id="three decimals"),
        pytest.param(7, "usd", "0.07 USD (7 minor units)", id="under one unit"),
        pytest.param(500, "zzz", "500 (minor units of ZZZ)", id="unknown currency"),
        pytest.param(500, None, "500 (minor units, no currency)", id="no currency"),
        pytest.param(None, "usd", "", id="no amount"),
        pytest.param(True, "usd", "", id="a boolean is no amount"),
    ],
)
def test_money_reads_as_a_human_would(minor_units: object, currency: object, shown: str) -> None:
    """An amount is shown in its currency's exponent, so that 820,000.00 is never mistaken
    for 82,000.00, then in the minor units a request carries; an unknown exponent is said to be
    minor units."""
    assert money(minor_units, currency) == shown


def test_pretty_json_keeps_the_characters_a_person_reads() -> None:
    """A lookup path's ``&`` is shown as ``&`` (never ``\\u0026``), indented for reading."""
    assert pretty({"path": "/v2/payments?a=1&b=2"}) == '{\n  "path": "/v2/payments?a=1&b=2"\n}'


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        pytest.param(
            "order 1042 \u202eDSU 00.0001", "order 1042 <U+202E>DSU 00.0001", id="override"
        ),
        pytest.param("a\u2067b\u2069c", "a<U+2067>b<U+2069>c", id="isolate"),
        pytest.param("zero\u200bwidth", "zero<U+200B>width", id="zero width space"),
        pytest.param("e\u0301\u0302 ok", "e\u0301\u0302 ok", id="a few marks kept"),
        pytest.param(
            "a" + "\u0301" * 7 + "b", "a" + "\u0301" * 4 + "<+3 combining marks>b", id="cut"
        ),
        pytest.param("\U0001f469\u200d\U0001f4bb", "\U0001f469\u200d\U0001f4bb", id="emoji joiner"),
        pytest.param("two\nlines\tand a tab", "two\nlines\tand a tab", id="line breaks kept"),
        pytest.param("\ud800", "<U+D800>", id="lone surrogate"),
    ],
)
def test_visible_shows_what_would_reorder_or_hide_text(text: str, shown: str) -> None:
    """A bidi control, an invisible format character or a lone surrogate is shown as an escape;
    a long run of combining marks is cut and counted; joiners and line breaks stay."""
    assert visible(text) == shown


@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(BIDI_CONTROLS)))
def test_no_text_made_visible_holds_a_control_or_a_long_run_of_marks(text: str) -> None:
    """Whatever the text, what is shown holds no bidi control, no format character but the
    joiners, and no more than MAX_COMBINING_RUN combining marks in a row."""
    shown = visible(text)
    assert not set(shown) & set(BIDI_CONTROLS)
    assert all(unicodedata.category(c) != "Cf" or c in "\u200c\u200d" for c in shown), shown
    run = 0
    for char in shown:
        run = run + 1 if unicodedata.category(char) in ("Mn", "Me") else 0
        assert run <= MAX_COMBINING_RUN


@given(st.text(alphabet=st.characters(categories=["L", "N", "P", "Zs"])))
def test_plain_text_is_shown_unchanged(text: str) -> None:
    """Letters, digits, punctuation and spaces are shown as they are."""
    assert visible(text) == text
