"""The console's rendering helpers, pure."""

from __future__ import annotations

import pytest

from proxy.console.render import money


@pytest.mark.parametrize(
    ("minor_units", "currency", "shown"),
    [
        pytest.param(8200000, "usd", "82000.00 USD", id="two decimals"),
        pytest.param(500, "jpy", "500 JPY", id="no decimals"),
        pytest.param(1234, "kwd", "1.234 KWD", id="three decimals"),
        pytest.param(7, "usd", "0.07 USD", id="under one unit"),
        pytest.param(500, "zzz", "500 minor units zzz", id="unknown currency"),
        pytest.param(500, None, "500 minor units", id="no currency"),
        pytest.param(None, "usd", "", id="no amount"),
        pytest.param(True, "usd", "", id="a boolean is no amount"),
    ],
)
def test_money_reads_as_a_human_would(minor_units: object, currency: object, shown: str) -> None:
    """An amount is shown in its currency's exponent, so that 820,000.00 is never mistaken
    for 82,000.00; an unknown exponent is said to be minor units."""
    assert money(minor_units, currency) == shown
