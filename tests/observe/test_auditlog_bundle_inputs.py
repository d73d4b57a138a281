"""``opgate audit verify-bundle`` on any input (proxy/observe/auditlog/cli.py, bundle.py):
JSON nested deeply, numbers too large, truncated base64, times out of range, Unicode that is
not text: a clear refusal (exit 2, one line saying what is wrong) and never a traceback; and a
value from a record is printed escaped, never acted on by the terminal."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.bundles import MINTED_OPERATION, audit_in_process, mint_bundle
from tests.support.transparency import LOG_SIGNER

LOG = LOG_SIGNER.verifier().vkey()
VALID = mint_bundle()


def edited(path: list[Any], value: Any) -> str:
    document = copy.deepcopy(VALID)
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return json.dumps(document)


CASES = {
    "nested-arrays": "[" * 200_000 + "]" * 200_000,
    "nested-in-a-field": edited(["answers"], json.loads("[" * 500 + "]" * 500)),
    "a-number-too-long": '{"format": "opgate-audit-bundle/2", "quorum": ' + "9" * 5000 + "}",
    "an-infinite-seq": edited(["records", 0, "seq"], 10**30).replace("1" + "0" * 30, "1e999"),
    "a-huge-leaf-index": edited(["records", 0, "leaf_index"], 10**40),
    "a-negative-leaf-index": edited(["records", 0, "leaf_index"], -1),
    "truncated-base64": edited(["records", 0, "inclusion", 0], "q83v"),
    "base64-not-ascii": edited(["records", 0, "inclusion", 0], "\u00e9" * 44),
    "a-time-without-zone": edited(["records", 0, "at"], "2026-01-01T00:00:00"),
    "a-lone-surrogate": edited(["records", 0, "stream"], "\ud800"),
    "hex-not-hex": edited(["records", 0, "hash"], "zz" * 32),
    "a-list": "[]",
    "the-first-format": edited(["format"], "opgate-audit-bundle/1"),
    "a-short-end-proof": edited(["ends", MINTED_OPERATION, "path"], ["AAAA"]),
    "a-head-not-a-list": edited(["ends", MINTED_OPERATION, "heads"], [5]),
    "answers-not-objects": edited(["answers", MINTED_OPERATION], "x"),
    "checkpoint-not-text": edited(["checkpoint"], 5),
}


@pytest.mark.parametrize("text", CASES.values(), ids=CASES.keys())
async def test_a_malformed_bundle_is_refused_clearly(text: str, tmp_path: Path) -> None:
    """Exit 2 with one line on stderr naming the problem; no traceback."""
    path = tmp_path / "bundle.json"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    code, out, err = await audit_in_process("verify-bundle", str(path), "--log-key", LOG)
    assert code == 2, out + err
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    assert err.startswith("opgate audit verify-bundle: "), err


async def test_a_time_at_the_edge_of_the_calendar_is_only_a_break(tmp_path: Path) -> None:
    """A record's time before year 1 in UTC: its hash does not match, exit 1, no traceback."""
    path = tmp_path / "bundle.json"
    path.write_text(edited(["records", 0, "at"], "0001-01-01T00:00:00+01:00"))
    code, out, err = await audit_in_process("verify-bundle", str(path), "--log-key", LOG)
    assert code == 1, out + err
    assert "seq 1: content does not match its hash" in out


async def test_bytes_that_are_not_utf8_are_refused(tmp_path: Path) -> None:
    """A file that is not UTF-8: exit 2, not a traceback."""
    path = tmp_path / "bundle.json"
    path.write_bytes(b'{"format": "\xff\xfe"}')
    code, _, err = await audit_in_process("verify-bundle", str(path), "--log-key", LOG)
    assert code == 2
    assert "Traceback" not in err


async def test_a_records_text_is_printed_escaped(tmp_path: Path) -> None:
    """An approver's name holding a right-to-left override and an escape sequence, in a record
    the log signed: the summary shows them as escapes, so the line reads as recorded."""
    document = copy.deepcopy(VALID)
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(document))
    code, out, _ = await audit_in_process("verify-bundle", str(path), "--log-key", LOG)
    assert code == 0, out
    assert "approved by alice (ref-1): refund.create on fault, 5.00 USD (500 minor units)" in out
    from proxy.observe.auditlog import evidence

    assert evidence.printable("a\u202eb\x1b[31m") == "a\\u202eb\\u001b[31m"
    assert evidence.money(500, None) == "500 minor units"
    assert evidence.money(500, "usd") == "5.00 USD (500 minor units)"


@pytest.mark.parametrize(
    ("currency", "shown"),
    [
        (None, "500 minor units"),
        ("usd", "5.00 USD (500 minor units)"),
        ("jpy", "500 JPY (500 minor units)"),
    ],
)
def test_an_approved_amount_reads_as_money(currency: str | None, shown: str) -> None:
    """The summary's approval line spells the amount in its currency's exponent with the minor
    units beside it, and never as "500 None"."""
    from datetime import UTC, datetime

    from proxy.observe.auditlog.chain import StoredRecord
    from proxy.observe.auditlog.evidence import operations

    fields = {
        "event": "created",
        "detail": {
            "approved_by": "alice",
            "action": "refund.create",
            "provider": "fault",
            "amount": 500,
            "currency": currency,
        },
    }
    record = StoredRecord(
        "op_1", 1, datetime.now(UTC), "transition", "op_1", json.dumps(fields), bytes(32), bytes(32)
    )
    [found] = operations([record], {})
    assert found.lines[0] == f"approved by alice (None): refund.create on fault, {shown}"
