"""Address safety for forward mode: which resolved addresses may be reached. Pure."""

from __future__ import annotations

import ipaddress

import pytest

from proxy.forward.destinations import AddressClass, classify_address, refused_address

CASES = [
    ("public v4", "93.184.216.34", AddressClass.PUBLIC),
    ("public v6", "2606:2800:220:1::1", AddressClass.PUBLIC),
    ("loopback", "127.0.0.1", AddressClass.LOOPBACK),
    ("loopback range", "127.8.9.10", AddressClass.LOOPBACK),
    ("loopback v6", "::1", AddressClass.LOOPBACK),
    ("v4-mapped loopback", "::ffff:127.0.0.1", AddressClass.LOOPBACK),
    ("rfc1918", "10.1.2.3", AddressClass.PRIVATE),
    ("rfc1918 192", "192.168.0.10", AddressClass.PRIVATE),
    ("unique local v6", "fd12:3456::1", AddressClass.PRIVATE),
    ("carrier-grade nat", "100.64.0.1", AddressClass.PRIVATE),
    ("unspecified", "0.0.0.0", AddressClass.PRIVATE),
    ("link-local", "169.254.10.10", AddressClass.LINK_LOCAL),
    ("link-local v6", "fe80::1", AddressClass.LINK_LOCAL),
    ("aws/gcp/azure metadata", "169.254.169.254", AddressClass.METADATA),
    ("aws metadata v6", "fd00:ec2::254", AddressClass.METADATA),
    ("metadata v4-mapped", "::ffff:169.254.169.254", AddressClass.METADATA),
]


@pytest.mark.parametrize(("scenario", "address", "expected"), CASES, ids=[c[0] for c in CASES])
def test_classify_address(scenario: str, address: str, expected: AddressClass) -> None:
    """Each address lands in the class that decides whether a policy must allow it."""
    assert classify_address(ipaddress.ip_address(address)) is expected


def test_public_addresses_need_no_allowance_and_others_do() -> None:
    """Only public addresses pass by default; loopback passes once a policy allows it."""
    assert refused_address(["93.184.216.34"], []) is None
    assert refused_address(["127.0.0.1"], []) == ("127.0.0.1", AddressClass.LOOPBACK)
    assert refused_address(["127.0.0.1"], [AddressClass.LOOPBACK]) is None


def test_one_unsafe_address_refuses_the_whole_answer() -> None:
    """A name that resolves to a public and a private address is refused (no guessing which
    one the connection would use)."""
    assert refused_address(["93.184.216.34", "10.0.0.1"], []) == ("10.0.0.1", AddressClass.PRIVATE)


def test_allowing_link_local_does_not_allow_metadata() -> None:
    """The metadata endpoint is its own class: a link-local allowance does not reach it."""
    refused = refused_address(["169.254.169.254"], [AddressClass.LINK_LOCAL])
    assert refused == ("169.254.169.254", AddressClass.METADATA)


def test_an_empty_or_unparsable_answer_is_refused() -> None:
    """No address at all, or something that is not an address, is never a reason to connect."""
    assert refused_address([], list(AddressClass)) is not None
    assert refused_address(["not-an-ip"], list(AddressClass)) is not None
