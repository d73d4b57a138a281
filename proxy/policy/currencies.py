"""ISO 4217 minor-unit exponents: how many decimal places a currency's amounts are written with.

A decimal amount (``"10.99"``) is the approved integer of minor units written with its
currency's exponent; a currency not listed here cannot be spelt as a decimal, and an approval
that needs it is refused (fail closed: guessing two places would misread ``"1099"`` JPY).

Source: ISO 4217 "List One: Currency, fund and precious metal codes", column "Minor unit",
as published by SIX Financial Information, the ISO 4217 maintenance agency
(https://www.six-group.com/en/products-services/financial-information/data-standards.html,
list_one.xml, published 2025-05-12). Codes without minor units there (precious metals, XDR,
XXX, XTS) are omitted on purpose: no payment API takes them as money.
"""

from __future__ import annotations


def _codes(text: str) -> list[str]:
    return text.split()


# Exponent 0: no minor unit; amounts are whole numbers ("1099" JPY is 1,099 yen).
_EXPONENT_0 = _codes("BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND VUV XAF XOF XPF")
# Exponent 3: three decimal places ("10.500" KWD).
_EXPONENT_3 = _codes("BHD IQD JOD KWD LYD OMR TND")
# Exponent 4: four decimal places (units of account).
_EXPONENT_4 = _codes("CLF UYW")
# Exponent 2: every other active code of List One.
_EXPONENT_2 = _codes(
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BMD BND BOB BOV BRL BSD BTN BWP "
    "BYN BZD CAD CDF CHE CHF CHW CNY COP COU CRC CUP CVE CZK DKK DOP DZD EGP ERN ETB EUR FJD "
    "FKP GBP GEL GHS GIP GMD GTQ GYD HKD HNL HTG HUF IDR ILS INR IRR JMD KES KGS KHR KPW KYD "
    "KZT LAK LBP LKR LRD LSL MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD "
    "NGN NIO NOK NPR NZD PAB PEN PGK PHP PKR PLN QAR RON RSD RUB SAR SBD SCR SDG SEK SGD SHP "
    "SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TOP TRY TTD TWD TZS UAH USD USN UYU UZS VED "
    "VES WST XCD XCG YER ZAR ZMW ZWG"
)

EXPONENTS: dict[str, int] = {
    **{code: 0 for code in _EXPONENT_0},
    **{code: 2 for code in _EXPONENT_2},
    **{code: 3 for code in _EXPONENT_3},
    **{code: 4 for code in _EXPONENT_4},
}


def exponent(currency: str | None) -> int | None:
    """The ISO 4217 exponent of ``currency`` (any ASCII case), or None if it is not listed."""
    if currency is None or not currency.isascii():
        return None
    return EXPONENTS.get(currency.upper())
