"""The application's ``Idempotency-Key`` on ``POST /v1/operations`` (the IETF httpapi draft):
the same key and approval answer the same operation, another approval under it is 422."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import make_mocked_request
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from proxy.operations.api import BadInput, request_key_of
from tests.support.opgate import REFUND_APPROVAL, Opgate, admin_headers

Count = Callable[[str], Awaitable[int]]


async def _post(gate: Opgate, body: Any, key: str | list[str] | None) -> tuple[int, dict[str, Any]]:
    headers = CIMultiDict(admin_headers())
    for value in [key] if isinstance(key, str) else key or []:
        headers.add("Idempotency-Key", value)
    async with gate.http.post(
        f"{gate.ops_url}/v1/operations", json=body, headers=headers
    ) as response:
        return response.status, await response.json(content_type=None)


@pytest.fixture
def count(database_url: str) -> Count:
    """How many operations carry an approval reference, read from the database itself."""

    async def operations_with(approval_ref: str) -> int:
        conn = await asyncpg.connect(database_url)
        try:
            found: int = await conn.fetchval(
                "SELECT count(*) FROM operations WHERE approval_ref = $1", approval_ref
            )
        finally:
            await conn.close()
        return found

    return operations_with


async def test_the_same_key_and_approval_answer_the_same_operation(
    fault_gate: Opgate, count: Count
) -> None:
    """A repeat (members in another order, a default spelled out) answers 200 with the row."""
    body = {**REFUND_APPROVAL, "approval_ref": "key-same"}
    first = await _post(fault_gate, body, '"k-same-1"')
    reordered = dict(reversed(list(body.items()))) | {"path_params": {}}
    again = await _post(fault_gate, reordered, '"k-same-1"')
    bare = await _post(fault_gate, body, "k-same-1")  # an unquoted value is the same key
    assert (first[0], again[0], bare[0]) == (201, 200, 200)
    assert again[1] == first[1] == bare[1]
    assert await count("key-same") == 1


async def test_the_same_key_with_another_approval_is_422(fault_gate: Opgate, count: Count) -> None:
    """Another amount under a used key is refused with idempotency_key_reused; nothing made."""
    body = {**REFUND_APPROVAL, "approval_ref": "key-other"}
    assert (await _post(fault_gate, body, '"k-other-1"'))[0] == 201
    status, refused = await _post(fault_gate, {**body, "amount": 900}, '"k-other-1"')
    assert (status, refused["code"]) == (422, "idempotency_key_reused")
    assert "900" not in refused["detail"]  # request bytes are never echoed
    assert await count("key-other") == 1


async def test_keys_are_scoped_to_the_tenant(fault_gate: Opgate, count: Count) -> None:
    """One key used by two tenants' approvals makes two operations, each its own."""
    body = {**REFUND_APPROVAL, "approval_ref": "key-tenant"}
    one = await _post(fault_gate, body, '"k-shared"')
    two = await _post(fault_gate, {**body, "tenant": "t2"}, '"k-shared"')
    assert (one[0], two[0]) == (201, 201)
    assert one[1]["operation_id"] != two[1]["operation_id"]


async def test_concurrent_twins_under_one_key_make_one_operation(
    fault_gate: Opgate, count: Count
) -> None:
    """Eight simultaneous posts of one approval and key: one 201, seven 200, one operation."""
    body = {**REFUND_APPROVAL, "approval_ref": "key-twins"}
    answers = await asyncio.gather(*(_post(fault_gate, body, '"k-twins"') for _ in range(8)))
    assert sorted(status for status, _ in answers) == [200] * 7 + [201]
    assert len({row["operation_id"] for _, row in answers}) == 1
    assert await count("key-twins") == 1


async def test_twins_naming_their_provider_key_make_one_operation(
    fault_gate: Opgate, count: Count
) -> None:
    """Simultaneous posts under one Idempotency-Key that also name the provider's key (whose
    unique index can trip first): all answer the one operation."""
    body = {**REFUND_APPROVAL, "approval_ref": "key-twins-pk", "idempotency_key": "pk-twins-1"}
    answers = await asyncio.gather(*(_post(fault_gate, body, '"k-twins-pk"') for _ in range(8)))
    assert sorted(status for status, _ in answers) == [200] * 7 + [201], answers
    assert len({row["operation_id"] for _, row in answers}) == 1
    assert await count("key-twins-pk") == 1


@pytest.mark.parametrize(
    ("scenario", "values"),
    [
        ("sent twice", ['"a"', '"a"']),
        ("empty string", ['""']),
        ("a space in a bare value", ["a b"]),
        ("unterminated", ['"abc']),
        ("a bad escape", ['"a\\nb"']),
        ("too long", ['"' + "k" * 256 + '"']),
    ],
)
async def test_a_malformed_key_is_400_and_creates_nothing(
    fault_gate: Opgate, count: Count, scenario: str, values: list[str]
) -> None:
    """An Idempotency-Key that is not one string of 1-255 printable ASCII is invalid_request."""
    ref = "key-bad-" + str(len(scenario))
    status, refused = await _post(fault_gate, {**REFUND_APPROVAL, "approval_ref": ref}, values)
    assert (status, refused["code"]) == (400, "invalid_request"), scenario
    assert await count(ref) == 0


_PRINTABLE = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255
)


@given(_PRINTABLE)
def test_a_quoted_key_reads_back_as_written(key: str) -> None:
    """Any printable ASCII key, written as a Structured Field String, is read back exactly."""
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    request = make_mocked_request(
        "POST", "/v1/operations", headers={"Idempotency-Key": f'"{escaped}"'}
    )
    assert request_key_of(request) == key


# A structured-field string, written here from RFC 8941 section 3.3.3 (not from the code under
# test): such a value is a quoted key, not a bare one ('"0"' is the key 0).
_QUOTED = re.compile(r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"')


@given(
    _PRINTABLE.filter(lambda k: ('"' in k or "\\" in k or " " in k) and not _QUOTED.fullmatch(k))
)
def test_a_bare_key_needing_quotes_is_refused(key: str) -> None:
    """A bare value holding a space, a quote or a backslash is refused, never guessed at (a
    whole quoted string is not bare: it is read as the key it quotes)."""
    request = make_mocked_request("POST", "/v1/operations", headers={"Idempotency-Key": key})
    with pytest.raises(BadInput):
        request_key_of(request)
