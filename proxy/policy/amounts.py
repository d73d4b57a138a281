"""How an amount is spelt in a request body, per the rule's ``amount_format``, and how it is
shown to a person (``human_amount``: the product's one formatter). Pure.

The approval always holds integer minor units. A rule reads the amount either as those minor
units (``1099``: a JSON integer, or the digits of a form value) or as a decimal string in the
currency's ISO 4217 exponent (``"10.99"`` USD, ``"1099"`` JPY, ``"10.990"`` KWD). Exactly one
spelling is accepted per amount and currency, the canonical one, so that the provider cannot
read a different amount from the one approved: ``"10.990"`` and ``"10.9"`` USD, ``"1.099e1"``,
``"+10.99"``, ``"010.99"`` and ``10.99`` as a JSON number are all refused.
"""

from __future__ import annotations

import re
from enum import StrEnum

from proxy.policy.currencies import exponent


class AmountFormat(StrEnum):
    MINOR_UNITS = "minor_units"  # 1099 (JSON integer) or "1099" (form)
    DECIMAL = "decimal"  # "10.99": a string in the currency's ISO 4217 exponent


_DIGITS = re.compile(r"0|[1-9][0-9]*")


def decimal_spelling(minor_units: int, currency: str | None) -> str | None:
    """The one decimal string for ``minor_units`` of ``currency``; None if the currency has
    no known exponent (or the amount is negative: no approval holds one)."""
    places = exponent(currency)
    if places is None or minor_units < 0:
        return None
    if places == 0:
        return str(minor_units)
    whole, fraction = divmod(minor_units, 10**places)
    return f"{whole}.{fraction:0{places}d}"


def human_amount(minor_units: int, currency: str | None, *, with_minor_units: bool = False) -> str:
    """An amount as a person reads it, the one spelling every page, message and table shows a
    human: in its currency's ISO 4217 exponent with the code upper case ("25.00 USD",
    "1099 JPY"), so that nobody misreads it by a factor of a hundred. Only where no exponent is
    known are the minor units shown, and said to be so. ``with_minor_units`` adds them in
    every case ("6.00 USD (600 minor units)"): where a person compares the amount with a
    request body or a provider's API, which speak minor units (the console, the CLI)."""
    spelt = decimal_spelling(minor_units, currency)
    if currency is None:
        return f"{minor_units} (minor units, no currency)"
    if spelt is None:
        return f"{minor_units} (minor units of {currency.upper()})"
    if with_minor_units and spelt != str(minor_units):
        return f"{spelt} {currency.upper()} ({minor_units} minor units)"
    return f"{spelt} {currency.upper()}"


def read_decimal(sent: object, currency: str | None) -> int | None:
    """The minor units ``sent`` spells canonically in ``currency``, or None if it does not."""
    places = exponent(currency)
    if places is None or not isinstance(sent, str) or not sent.isascii():
        return None
    whole, dot, fraction = sent.partition(".")
    if not _DIGITS.fullmatch(whole):
        return None
    if places == 0:
        return int(whole) if not dot else None
    if not dot or len(fraction) != places or not fraction.isdigit():
        return None
    return int(whole) * int(10**places) + int(fraction)


def read_minor_units(sent: object, *, as_text: bool) -> int | None:
    """The integer ``sent`` spells canonically: digits without a sign or leading zero in a form
    (``as_text``), a JSON integer (never a bool or a float) otherwise."""
    if as_text:
        if isinstance(sent, str) and sent.isascii() and _DIGITS.fullmatch(sent):
            return int(sent)
        return None
    if isinstance(sent, int) and not isinstance(sent, bool):
        return sent
    return None


def spelling(
    fmt: AmountFormat, minor_units: int, currency: str | None, *, as_text: bool
) -> str | int | None:
    """What a body holds for an approved amount: the value ``read`` maps back to it."""
    if fmt is AmountFormat.DECIMAL:
        return decimal_spelling(minor_units, currency)
    return str(minor_units) if as_text else minor_units


def read(fmt: AmountFormat, sent: object, currency: str | None, *, as_text: bool) -> int | None:
    if fmt is AmountFormat.DECIMAL:
        return read_decimal(sent, currency)
    return read_minor_units(sent, as_text=as_text)
