"""The records' JSON (proxy/observe/auditlog/records.py): made by orjson where it can be, always
the bytes json.dumps made before."""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

import pytest

from proxy.observe.audit import AuditRecord
from proxy.observe.auditlog import records
from proxy.observe.auditlog.storable import storable


def _json_text(record: dict[str, Any]) -> str:
    """The record's text as it was made before orjson: json.dumps, compact, no NaN."""
    return json.dumps(storable(record), separators=(",", ":"), allow_nan=False, default=str)


def _float(rng: random.Random) -> float:
    pick = rng.randrange(4)
    if pick == 0:  # any bit pattern: NaNs, infinities, subnormals, every exponent
        value: float = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        return value
    if pick == 1:
        return rng.choice([0.0, -0.0, 1e-4, 9.9999e-5, 1e16, 9999999999999998.0, math.inf])
    return round(rng.uniform(-1, 1) * 10 ** rng.uniform(-12, 20), rng.randrange(12))


def _scalar(rng: random.Random) -> Any:
    pick = rng.randrange(7)
    if pick == 0:
        return _float(rng)
    if pick == 1:
        return rng.choice([0, -1, 2**63 - 1, -(2**63), 2**64, -(2**70), True, False, None])
    if pick == 2:  # every ASCII character, DEL and a few beyond
        return "".join(chr(rng.choice([*range(128), 0xE9, 0x2028, 0x1F642])) for _ in range(6))
    return rng.choice(["allow", "op_123", "/v1/refunds", 'a "quoted" \\ path', ""])


def _record(rng: random.Random) -> dict[str, Any]:
    made: dict[Any, Any] = {f"k{i}": _scalar(rng) for i in range(rng.randrange(12))}
    shape = rng.randrange(8)
    if shape == 0:
        made["precondition"] = {"read": {"n": [_scalar(rng), _scalar(rng)]}}
    elif shape == 1:
        made[7] = "an integer key"
    elif shape == 2:
        made["echoes"] = ["Authorization"]
    return made


def test_a_record_text_is_the_json_dumps_text_on_many_records() -> None:
    """On 20,000 varied records (floats of every exponent, NaN and infinities, integers past 64
    bits, every ASCII character and DEL, non-ASCII text, nested values, integer keys), the
    text is json.dumps' text, byte for byte, or both refuse the record with a ValueError."""
    rng = random.Random(7)
    made_by_orjson = 0
    for _ in range(20_000):
        record = _record(rng)
        try:
            expected = _json_text(record)
        except ValueError:
            with pytest.raises(ValueError, match="JSON compliant"):
                records.record_text(record)
            continue
        assert records.record_text(record) == expected, record
        made_by_orjson += records._orjson_spells_alike(storable(record))
    assert made_by_orjson > 5_000  # the fast path was taken, and checked


def test_a_request_record_is_made_by_orjson() -> None:
    """A request's usual record is one orjson makes (else the saving is not there)."""
    made = AuditRecord(method="POST", path="/stripe/v1/refunds", policy_version="v1")
    made.operation_id, made.decision, made.attempt = "op_1", "allow", 1
    fields = made.fields()
    assert records._orjson_spells_alike(storable(fields))
    assert records.record_text(fields) == _json_text(fields)
