"""The console's rendering helpers, pure."""

from __future__ import annotations

import pytest

from proxy.console.render import money, pretty


@pytest.mark.parametrize(
    ("minor_units", "currency", "shown"),
    [
        pytest.param(8200000, "usd", "82000.00 USD", id="two decimals"),
        pytest.param(500, "jpy", "500 JPY", id="no decimals"),
        pytest.param(1234, "kwd", "1.234 KWD", id="three decimals"),
        pytest.param(7, "usd", "0.07 USD", id="under one unit"),
        pytest.param(500, "zzz", "500 (minor units of ZZZ)", id="unknown currency"),
        pytest.param(500, None, "500 (minor units, no currency)", id="no currency"),
        pytest.param(None, "usd", "", id="no amount"),
        pytest.param(True, "usd", "", id="a boolean is no amount"),
    ],
)
def test_money_reads_as_a_human_would(minor_units: object, currency: object, shown: str) -> None:
    """An amount is shown in its currency's exponent, so that 820,000.00 is never mistaken
    for 82,000.00; an unknown exponent is said to be minor units."""
    assert money(minor_units, currency) == shown


def test_pretty_json_keeps_the_characters_a_person_reads() -> None:
    """A lookup path's ``&`` is shown as ``&`` (never ``\\u0026``), indented for reading."""
    assert pretty({"path": "/v2/payments?a=1&b=2"}) == '{\n  "path": "/v2/payments?a=1&b=2"\n}'
