"""The fault provider produces each outcome it promises, and records the ground truth."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.support.fault_provider import FaultMode, FaultProvider, running_fault_provider

REFUND_FORM = {"charge": "ch_1", "amount": "500", "metadata[operation_id]": "op_1"}


@pytest_asyncio.fixture(loop_scope="session")
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp client: no proxy (trust_env is off), no retries."""
    async with aiohttp.ClientSession() as session:
        yield session


async def refund(
    client: aiohttp.ClientSession,
    provider: FaultProvider,
    *,
    key: str | None = None,
    form: dict[str, str] | None = None,
    client_timeout: float | None = None,
) -> tuple[int, dict[str, object], str | None]:
    """POST a refund to the provider; return status, JSON body and Idempotent-Replayed."""
    headers = {"Authorization": "Bearer sk_test_provider", "X-Operation-Id": "op_1"}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with client.post(
        f"{provider.url}/v1/refunds",
        data=REFUND_FORM if form is None else form,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=client_timeout),
    ) as response:
        body: dict[str, object] = await response.json()
        return response.status, body, response.headers.get("Idempotent-Replayed")


async def test_ok_commits_and_answers_a_refund(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """ok records one effect from the form body and answers it as a Stripe-like refund."""
    status, body, _ = await refund(client, fault_provider, key="k1")

    assert status == 200
    assert body == {
        "id": "re_1",
        "object": "refund",
        "amount": 500,
        "metadata": {"operation_id": "op_1"},
        "status": "succeeded",
        "charge": "ch_1",
    }
    [effect] = fault_provider.effects
    assert (effect.id, effect.idempotency_key, effect.operation_id) == ("re_1", "k1", "op_1")
    assert effect.fields == REFUND_FORM
    assert effect.request is fault_provider.requests[0]


async def test_json_body_is_understood(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A JSON body gives the same effect fields, amount and metadata as a form."""
    payload = {"charge": "ch_2", "amount": 70, "metadata": {"operation_id": "op_j"}}
    async with client.post(f"{fault_provider.url}/v1/refunds", json=payload) as response:
        assert response.status == 200
        assert (await response.json())["metadata"] == {"operation_id": "op_j"}
    [effect] = fault_provider.effects
    assert (effect.amount, effect.metadata, effect.fields) == (
        70,
        {"operation_id": "op_j"},
        payload,
    )


async def test_requests_record_exact_headers_and_body(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """Every request is recorded as it arrived: method, path, query, headers, raw bytes."""
    async with client.post(
        f"{fault_provider.url}/v1/refunds?expand=charge",
        data=b"amount=1&amount=2",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "Bearer sk_live_upstream",
            "X-Trace": "a",
        },
    ):
        pass
    [seen] = fault_provider.requests
    assert (seen.method, seen.path, seen.query_string) == ("POST", "/v1/refunds", "expand=charge")
    assert seen.body == b"amount=1&amount=2"
    assert seen.headers["authorization"] == "Bearer sk_live_upstream"
    assert seen.headers.getall("X-Trace") == ["a"]
    assert seen.mode is FaultMode.OK
    assert seen.fields == {"amount": "2"}


async def test_fail_answers_402_without_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """fail refuses like a declined card and commits nothing."""
    fault_provider.mode = "fail"
    status, body, _ = await refund(client, fault_provider)
    assert status == 402
    assert body["error"] == {
        "type": "card_error",
        "code": "card_declined",
        "message": "Your card was declined.",
    }
    assert fault_provider.effects == []
    assert len(fault_provider.requests) == 1


async def test_error_after_commit_answers_500_with_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """error_after_commit commits the refund and still answers 500: an unknown outcome."""
    fault_provider.mode = FaultMode.ERROR_AFTER_COMMIT
    status, _, _ = await refund(client, fault_provider)
    assert status == 500
    assert len(fault_provider.effects) == 1


async def test_drop_after_commit_disconnects_with_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """drop_after_commit commits, then the client sees a dropped connection, not an answer."""
    fault_provider.mode = FaultMode.DROP_AFTER_COMMIT
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await refund(client, fault_provider)
    assert len(fault_provider.effects) == 1
    assert len(fault_provider.requests) == 1


async def test_drop_after_commit_on_a_reused_connection(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A drop on a kept-alive connection is still a disconnect, and the client does not resend."""
    fault_provider.script("ok", "drop_after_commit")
    await refund(client, fault_provider)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await refund(client, fault_provider)
    assert [r.mode for r in fault_provider.requests] == ["ok", "drop_after_commit"]
    assert len(fault_provider.effects) == 2


async def test_stall_times_the_client_out_without_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """stall holds the request, so the client's own timeout fires; nothing is committed."""
    fault_provider.mode = "stall"
    with pytest.raises(TimeoutError):
        await refund(client, fault_provider, client_timeout=0.2)
    assert fault_provider.in_flight.is_set()
    assert fault_provider.stalled == 1
    assert fault_provider.effects == []


async def test_stall_after_commit_times_out_with_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """stall_after_commit commits and then holds the answer past the client's timeout."""
    fault_provider.mode = FaultMode.STALL_AFTER_COMMIT
    with pytest.raises(TimeoutError):
        await refund(client, fault_provider, client_timeout=0.2)
    assert len(fault_provider.effects) == 1


async def test_in_flight_lets_a_test_race_a_stalled_request(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """in_flight is set while a request is held, and release lets it answer; no sleeps."""
    fault_provider.script("stall_after_commit", "ok")
    first = asyncio.create_task(refund(client, fault_provider, key="k1"))
    await fault_provider.in_flight.wait()

    assert (await refund(client, fault_provider, key="k2"))[0] == 200
    assert not first.done()
    assert [e.idempotency_key for e in fault_provider.effects] == ["k1", "k2"]

    fault_provider.release()
    status, body, _ = await first
    assert (status, body["id"]) == (200, "re_1")
    assert not fault_provider.in_flight.is_set()


async def test_release_then_stall_again(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A release frees the stalls of that moment only; a later stall waits for its own release."""
    fault_provider.mode = "stall"
    first = asyncio.create_task(refund(client, fault_provider))
    await fault_provider.in_flight.wait()
    fault_provider.release()
    assert (await first)[0] == 503

    second = asyncio.create_task(refund(client, fault_provider))
    await fault_provider.in_flight.wait()
    assert fault_provider.stalled == 1
    fault_provider.release()
    assert (await second)[0] == 503
    assert fault_provider.effects == []


async def test_script_then_standing_mode(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """Scripted modes apply one per request in order, then the standing mode takes over."""
    fault_provider.script(FaultMode.ERROR_AFTER_COMMIT, "fail")
    fault_provider.mode = "ok"
    statuses = [(await refund(client, fault_provider))[0] for _ in range(3)]
    assert statuses == [500, 402, 200]
    assert fault_provider.scripted == ()
    assert len(fault_provider.effects) == 2


def test_unknown_mode_is_refused() -> None:
    """A typo in a mode name fails at once instead of silently meaning ok."""
    provider = FaultProvider()
    with pytest.raises(ValueError, match="drop_after_comit"):
        provider.mode = "drop_after_comit"
    with pytest.raises(ValueError, match="stal"):
        provider.script("ok", "stal")


async def test_without_dedupe_every_repeat_is_a_new_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """With deduplicate off, the same Idempotency-Key twice makes two effects."""
    for _ in range(2):
        await refund(client, fault_provider, key="same")
    assert [e.id for e in fault_provider.effects] == ["re_1", "re_2"]


@pytest.mark.parametrize(
    "first_mode",
    [
        pytest.param(FaultMode.OK, id="after-ok"),
        pytest.param(FaultMode.ERROR_AFTER_COMMIT, id="after-error_after_commit"),
        pytest.param(FaultMode.DROP_AFTER_COMMIT, id="after-drop_after_commit"),
    ],
)
async def test_dedupe_replays_the_first_effect(
    client: aiohttp.ClientSession, fault_provider: FaultProvider, first_mode: FaultMode
) -> None:
    """With deduplicate on, a retry with the same key gets the first effect back, no new one."""
    fault_provider.deduplicate = True
    fault_provider.script(first_mode)
    try:
        await refund(client, fault_provider, key="same")
    except aiohttp.ServerDisconnectedError:
        assert first_mode is FaultMode.DROP_AFTER_COMMIT

    status, body, replayed = await refund(client, fault_provider, key="same")
    assert (status, body["id"], replayed) == (200, "re_1", "true")
    assert len(fault_provider.effects) == 1
    assert len(fault_provider.requests) == 2

    assert (await refund(client, fault_provider, key="other"))[1]["id"] == "re_2"


async def test_dedupe_keeps_the_fault_of_the_retry(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A deduplicated retry still suffers its own mode: a replay can also answer 500."""
    fault_provider.deduplicate = True
    fault_provider.script("ok", "error_after_commit")
    await refund(client, fault_provider, key="same")
    assert (await refund(client, fault_provider, key="same"))[0] == 500
    assert len(fault_provider.effects) == 1


async def test_dedupe_refuses_a_key_reused_with_other_parameters(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """Like Stripe, the same key with a different body is a 400 idempotency_error, no effect."""
    fault_provider.deduplicate = True
    await refund(client, fault_provider, key="same")
    status, body, _ = await refund(
        client, fault_provider, key="same", form={**REFUND_FORM, "amount": "600"}
    )
    assert status == 400
    assert body["error"] == {
        "type": "idempotency_error",
        "code": "idempotency_key_in_use",
        "message": "Keys for idempotent requests can only be used with the same parameters.",
    }
    assert len(fault_provider.effects) == 1


async def test_get_never_commits(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A safe method lists the effects under ok and commits nothing under any mode."""
    await refund(client, fault_provider)
    fault_provider.script("ok", "error_after_commit")
    async with client.get(f"{fault_provider.url}/v1/refunds") as response:
        assert [r["id"] for r in (await response.json())["data"]] == ["re_1"]
    async with client.get(f"{fault_provider.url}/v1/refunds") as response:
        assert response.status == 500
    assert len(fault_provider.effects) == 1


async def test_teardown_releases_a_request_left_stalled(
    client: aiohttp.ClientSession,
) -> None:
    """Stopping the provider releases a stall the test never released; the request ends 503."""
    async with running_fault_provider() as provider:
        provider.mode = "stall"
        pending = asyncio.create_task(refund(client, provider))
        await provider.in_flight.wait()
    status, body, _ = await pending
    assert (status, body["error"]) == (
        503,
        {
            "type": "api_error",
            "code": "stalled",
            "message": "Released after a stall; nothing done.",
        },
    )


async def test_chooser_decides_each_request_before_the_script(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A chooser picks a request's mode from the request itself (here: by method); where it
    names none, the script and then the standing mode apply as before."""
    fault_provider.chooser = lambda request: (
        FaultMode.ERROR_AFTER_COMMIT if request.method == "GET" else None
    )
    fault_provider.script("fail")
    async with client.get(f"{fault_provider.url}/v1/refunds") as response:
        assert response.status == 500
    statuses = [(await refund(client, fault_provider))[0] for _ in range(2)]
    assert statuses == [402, 200]
    assert [r.mode for r in fault_provider.requests] == ["error_after_commit", "fail", "ok"]
    assert len(fault_provider.effects) == 1


async def test_slow_answers_late_with_what_was_true_on_arrival(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """A slow lookup answers after slow_seconds with the list as it was when it arrived; a
    slow POST commits at once and answers after the delay."""
    fault_provider.slow_seconds = 0.3
    arrived = asyncio.Event()

    def slow_lookups(request: web.Request) -> FaultMode | None:
        if request.method != "GET":
            return None
        arrived.set()
        return FaultMode.SLOW

    fault_provider.chooser = slow_lookups
    lookup = asyncio.create_task(client.get(f"{fault_provider.url}/v1/refunds"))
    await arrived.wait()
    assert (await refund(client, fault_provider))[0] == 200
    async with await lookup as response:
        assert (await response.json())["data"] == []
    assert len(fault_provider.effects) == 1

    fault_provider.chooser = None
    fault_provider.mode = "slow"
    with pytest.raises(TimeoutError):
        await refund(client, fault_provider, key="k2", client_timeout=0.1)
    assert [e.idempotency_key for e in fault_provider.effects] == [None, "k2"]


async def test_dedupe_replays_rather_than_declines_a_key_that_committed(
    client: aiohttp.ClientSession, fault_provider: FaultProvider
) -> None:
    """With deduplicate on, fail for a key that already made an effect replays that effect:
    the idempotency layer answers before the provider decides anything anew."""
    fault_provider.deduplicate = True
    fault_provider.script("error_after_commit", "fail", "fail")
    assert (await refund(client, fault_provider, key="same"))[0] == 500
    status, body, replayed = await refund(client, fault_provider, key="same")
    assert (status, body["id"], replayed) == (200, "re_1", "true")
    assert (await refund(client, fault_provider, key="other"))[0] == 402
    assert len(fault_provider.effects) == 1
