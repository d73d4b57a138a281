"""How a provider's answer settles an operation (proxy/gate/classify.py)."""

from __future__ import annotations

import pytest

from proxy.gate.classify import Settled, Unknown, classify_answer, object_id_from
from proxy.policy.model import Classification
from proxy.store.operation import LastOutcome, Status

STRIPE_LIKE = Classification(confirmed=["2xx"], failed=[400, 402, 404], object_id="/id")

CASES: list[tuple[str, int, bytes, Settled | Unknown]] = [
    ("200 confirms", 200, b'{"id": "re_1"}', Settled(Status.CONFIRMED, "re_1")),
    ("201 confirms", 201, b'{"id": "re_1"}', Settled(Status.CONFIRMED, "re_1")),
    ("2xx without a JSON body", 204, b"", Settled(Status.CONFIRMED, None)),
    ("listed 4xx fails", 402, b'{"id": "ignored"}', Settled(Status.FAILED, None)),
    ("unlisted 4xx is unknown", 409, b"{}", Unknown(LastOutcome.UNKNOWN_STATUS)),
    ("429 is unknown", 429, b"{}", Unknown(LastOutcome.UNKNOWN_STATUS)),
    ("5xx is unknown", 500, b"{}", Unknown(LastOutcome.UNKNOWN_STATUS)),
    ("3xx is unknown", 302, b"", Unknown(LastOutcome.UNKNOWN_STATUS)),
    ("1xx is unknown", 100, b"", Unknown(LastOutcome.UNKNOWN_STATUS)),
]


@pytest.mark.parametrize(
    ("status", "body", "expected"), [pytest.param(*case[1:], id=case[0]) for case in CASES]
)
def test_classify_answer(status: int, body: bytes, expected: Settled | Unknown) -> None:
    """Only a status the policy names settles the operation; everything else stays unknown."""
    assert classify_answer(STRIPE_LIKE, status, body) == expected


def test_nothing_fails_by_default() -> None:
    """The default classification confirms 2xx and leaves every other status unknown."""
    default = Classification()
    assert classify_answer(default, 400, b"") == Unknown(LastOutcome.UNKNOWN_STATUS)
    assert classify_answer(default, 200, b'{"id": "x"}') == Settled(Status.CONFIRMED, "x")


def test_no_object_id_pointer() -> None:
    """A classification without object_id never extracts one."""
    classification = Classification(object_id=None)
    assert classify_answer(classification, 200, b'{"id": "x"}') == Settled(Status.CONFIRMED, None)


OBJECT_IDS: list[tuple[str, str | None, bytes, str | None]] = [
    ("top-level id", "/id", b'{"id": "ch_1"}', "ch_1"),
    ("nested", "/data/0/id", b'{"data": [{"id": "x"}]}', "x"),
    ("escaped pointer", "/a~1b/c~0d", b'{"a/b": {"c~d": "y"}}', "y"),
    ("no pointer", None, b'{"id": "ch_1"}', None),
    ("not JSON", "/id", b"<html>", None),
    ("not UTF-8", "/id", b'{"id": "\xff"}', None),
    ("empty body", "/id", b"", None),
    ("missing key", "/id", b'{"other": 1}', None),
    ("non-string id", "/id", b'{"id": 123}', None),
    ("object id", "/id", b'{"id": {"x": 1}}', None),
    ("index out of range", "/data/1", b'{"data": ["a"]}', None),
    ("non-numeric index", "/data/x", b'{"data": ["a"]}', None),
    ("non-ASCII zero index", "/data/\u0660", b'{"data": ["a"]}', None),
    ("superscript digit index", "/data/\u00b2", b'{"data": ["a", "b", "c"]}', None),
    ("key into a string", "/id/x", b'{"id": "s"}', None),
    ("top-level array", "/0", b'["z"]', "z"),
    ("huge integer body", "/id", b"1" * 5000, None),
]


@pytest.mark.parametrize(
    ("pointer", "body", "expected"), [pytest.param(*case[1:], id=case[0]) for case in OBJECT_IDS]
)
def test_object_id_from(pointer: str | None, body: bytes, expected: str | None) -> None:
    """The object id is the string a JSON pointer names, and None whenever there is no such."""
    assert object_id_from(pointer, body) == expected
