"""Amount spelling (proxy/policy/amounts.py) and the ISO 4217 exponent table: every approved
amount has exactly one decimal spelling per currency, and that spelling reads back to it."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.policy.amounts import decimal_spelling, human_amount, read_decimal, read_minor_units
from proxy.policy.currencies import EXPONENTS, exponent

CURRENCIES = sorted(EXPONENTS)


@pytest.mark.parametrize(
    ("currency", "places"),
    [
        *[("JPY", 0), ("KRW", 0), ("CLP", 0), ("VND", 0), ("XOF", 0), ("ISK", 0), ("UGX", 0)],
        *[("KWD", 3), ("BHD", 3), ("JOD", 3), ("OMR", 3), ("TND", 3), ("IQD", 3), ("LYD", 3)],
        *[("USD", 2), ("EUR", 2), ("usd", 2), ("CLF", 4)],
    ],
)
def test_the_table_holds_the_iso_exponents(currency: str, places: int) -> None:
    """The exponent of well-known currencies, in either case, is ISO 4217's."""
    assert exponent(currency) == places


@pytest.mark.parametrize("currency", ["XYZ", "XAU", "", "\u212aWD", None])
def test_unknown_currencies_have_no_exponent(currency: str | None) -> None:
    """A code outside the table (or spelt with non-ASCII) has no exponent: no decimal spelling."""
    assert exponent(currency) is None
    assert decimal_spelling(100, currency) is None
    assert read_decimal("1.00", currency) is None


@given(st.integers(min_value=0, max_value=2**53 - 1), st.sampled_from(CURRENCIES))
def test_the_spelling_reads_back_to_the_amount(minor_units: int, currency: str) -> None:
    """decimal_spelling and read_decimal are inverse, and the spelling is the number itself."""
    spelt = decimal_spelling(minor_units, currency)
    assert spelt is not None
    assert read_decimal(spelt, currency) == minor_units
    places = EXPONENTS[currency]
    assert Decimal(spelt) == Decimal(minor_units).scaleb(-places)


@given(
    st.integers(min_value=0, max_value=10**12),
    st.sampled_from(CURRENCIES),
    st.sampled_from(["0", "00", ".", "e0", "E0", " ", "+", "-"]),
    st.booleans(),
)
def test_no_other_spelling_is_read(
    minor_units: int, currency: str, noise: str, prefix: bool
) -> None:
    """The canonical spelling with anything added before or after it never reads as the same
    amount (at most as another one: "1" + "0" is ten yen)."""
    spelt = decimal_spelling(minor_units, currency)
    assert spelt is not None
    other = noise + spelt if prefix else spelt + noise
    assert read_decimal(other, currency) != minor_units


@pytest.mark.parametrize(
    ("sent", "as_text", "expected"),
    [
        ("1099", True, 1099),
        ("0", True, 0),
        ("01099", True, None),
        ("+1099", True, None),
        ("1099.0", True, None),
        ("\u0661", True, None),
        (1099, False, 1099),
        (True, False, None),
        (1099.0, False, None),
        ("1099", False, None),
    ],
)
def test_minor_units_are_read_only_as_canonical_integers(
    sent: object, as_text: bool, expected: int | None
) -> None:
    """Form digits without sign or leading zero; JSON integers, never bools or floats."""
    assert read_minor_units(sent, as_text=as_text) == expected


@pytest.mark.parametrize(
    ("minor_units", "currency", "shown"),
    [
        pytest.param(2500, "usd", "25.00 USD", id="two decimals"),
        pytest.param(1099, "JPY", "1099 JPY", id="no decimals"),
        pytest.param(1234, "kwd", "1.234 KWD", id="three decimals"),
        pytest.param(7, "usd", "0.07 USD", id="under one unit"),
        pytest.param(8200000, "usd", "82000.00 USD", id="never a factor of a hundred off"),
        pytest.param(500, "zzz", "500 (minor units of ZZZ)", id="unknown currency"),
        pytest.param(500, None, "500 (minor units, no currency)", id="no currency"),
    ],
)
def test_human_amount_is_the_one_spelling_a_person_reads(
    minor_units: int, currency: str | None, shown: str
) -> None:
    """Every amount shown to a person is in its currency's exponent with the code upper case;
    only where no exponent is known are the minor units shown, and said to be so."""
    assert human_amount(minor_units, currency) == shown
