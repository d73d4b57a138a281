"""The benchmark's own parts (bench/): the open-loop generator's schedule, response parser and
measurement, the lean gate's strict form parser, and the runner's small parsers. Nothing here
asserts a speed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import sys
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from aiohttp import web

from tests.support.paths import REPO


def bench_module(name: str) -> ModuleType:
    """bench/<name>.py, which is a script folder and not a package."""
    key = f"bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


open_loop = bench_module("open_loop")
lean_gate = bench_module("lean_gate")
runner = bench_module("run")


# --------------------------------------------------------------------------- the schedule


def test_request_i_is_due_at_i_over_rate() -> None:
    """The schedule depends on the rate only: request i at i/rate seconds after t0."""
    assert open_loop.scheduled_offsets(200, 4) == [0.0, 0.005, 0.01, 0.015]
    assert open_loop.scheduled_offsets(0.5, 3) == [0.0, 2.0, 4.0]


def test_a_rate_that_is_not_positive_is_refused() -> None:
    """A zero or negative rate has no schedule."""
    with pytest.raises(ValueError, match="rate"):
        open_loop.scheduled_offsets(0, 3)


def test_every_request_names_its_own_operation_warm_up_included() -> None:
    """With an ids base, request i carries X-Operation-Id base+i and a correct Content-Length."""
    plan = open_loop.parse_args(
        ["--url", "http://127.0.0.1:9/bench/v1/refunds", "--method", "POST", "--body", "a=1",
         "--rate", "10", "--duration", "0.5", "--warmup", "0.2", "--ids-base", "700"]
    )  # fmt: skip
    requests = open_loop.requests_for(plan)
    assert [r.index for r in requests] == list(range(7))
    assert [r.scheduled for r in requests] == pytest.approx([i / 10 for i in range(7)])
    for number, request in enumerate(requests):
        head, _, body = request.data.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /bench/v1/refunds HTTP/1.1\r\nHost: 127.0.0.1:9\r\n")
        assert f"X-Operation-Id: {700 + number}".encode() in head.split(b"\r\n")
        assert b"Content-Length: 3" in head.split(b"\r\n")
        assert body == b"a=1"


def test_nearest_rank_percentiles() -> None:
    """p50 of 1..10 is 5, p99 and p99.9 are the largest value, and no values give 0."""
    values = [float(v) for v in range(1, 11)]
    assert open_loop.percentile(values, 50) == 5.0
    assert open_loop.percentile(values, 90) == 9.0
    assert open_loop.percentile(values, 99.9) == 10.0
    assert open_loop.percentile([], 50) == 0.0


# --------------------------------------------------------------------------- the parser


def test_a_response_with_content_length_ends_after_its_body() -> None:
    """Content-Length delimits the response; fewer bytes mean wait for more."""
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\n\r\nhello"
    parsed = open_loop.parse_response(raw + b"HTTP/1.1 ...")
    assert parsed == open_loop.ParsedResponse(200, len(raw), True)
    assert open_loop.parse_response(raw[:-1]) is None
    assert open_loop.parse_response(raw[:10]) is None


def test_a_chunked_response_ends_after_its_last_chunk() -> None:
    """Chunked encoding is followed to the zero-size chunk, trailers included."""
    raw = b"HTTP/1.1 422 Unprocessable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    assert open_loop.parse_response(raw) == open_loop.ParsedResponse(422, len(raw), True)
    assert open_loop.parse_response(raw[:-2]) is None
    with_trailer = raw[:-2] + b"X-T: 1\r\n\r\n"
    assert open_loop.parse_response(with_trailer) == open_loop.ParsedResponse(
        422, len(with_trailer), True
    )


def test_connection_close_and_close_delimited_bodies_end_keep_alive() -> None:
    """Connection: close, or a body without a length, ends the connection after the answer."""
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    assert open_loop.parse_response(closing) == open_loop.ParsedResponse(200, len(closing), False)
    unbounded = b"HTTP/1.1 200 OK\r\n\r\nuntil the end"
    assert open_loop.parse_response(unbounded) is None
    assert open_loop.parse_response(unbounded, closed=True) == open_loop.ParsedResponse(
        200, len(unbounded), False
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"SMTP 220 hello\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
def test_bytes_that_are_not_a_delimitable_response_are_refused(raw: bytes) -> None:
    """A bad status line, header line, length or chunk size raises instead of guessing."""
    with pytest.raises(open_loop.MalformedResponse):
        open_loop.parse_response(raw)


# --------------------------------------------------------------------------- against a server


@contextlib.asynccontextmanager
async def slow_server(service_seconds: float) -> AsyncIterator[str]:
    """A real HTTP server on 127.0.0.1 that answers each request after ``service_seconds``."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(service_seconds)  # the server's service time, not a test wait
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    runner_ = web.AppRunner(app, access_log=None)
    await runner_.setup()
    site = web.TCPSite(runner_, "127.0.0.1", 0)
    await site.start()
    port = runner_.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/x"
    finally:
        await runner_.cleanup()


def plan_for(url: str, **overrides: Any) -> Any:
    plan = open_loop.parse_args(["--url", url, "--rate", "100", "--duration", "0.5"])
    return dataclasses.replace(plan, **({"warmup": 0.0, "timeout": 10.0} | overrides))


async def test_latency_counts_from_the_schedule_when_the_server_falls_behind() -> None:
    """With one connection and a 20 ms server at 100/s, requests queue: latency from the
    scheduled time grows to about half a second although each answer takes 20 ms."""
    async with slow_server(0.02) as url:
        plan = plan_for(url, connections=1, max_connections=1)
        result = await open_loop.run(plan)
    assert result["scheduled"] == 50
    assert result["statuses"] == {"200": 50}
    assert result["queued_for_connection"] > 0
    assert result["late"]["count"] > 0
    # the 50th answer cannot come before 50 x 20 ms; it was due at 0.49 s
    assert result["latency_us"]["max"] >= 0.45e6
    assert result["service_time_us"]["max"] < result["latency_us"]["max"]


async def test_it_opens_connections_rather_than_wait_for_a_free_one() -> None:
    """At 200/s against a 100 ms server, starting from one connection, it opens more."""
    async with slow_server(0.1) as url:
        plan = plan_for(url, rate=200.0, duration=0.25, connections=1)
        result = await open_loop.run(plan)
    assert result["statuses"] == {"200": 50}
    assert result["connections"]["opened"] >= 5
    assert result["max_in_flight"] >= 5
    assert result["unanswered_after_timeout"] == 0


# --------------------------------------------------------------------------- the lean gate


def test_the_lean_gate_reads_exactly_the_three_fields() -> None:
    """amount, currency and charge, once each, are what the claim compares."""
    fields = lean_gate.parse_form(b"amount=1000&currency=usd&charge=ch_1")
    assert fields == {"amount": "1000", "currency": "usd", "charge": "ch_1"}


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"amount=1000&amount=1&currency=usd&charge=ch_1", "request_malformed"),
        (b"amount=1000&currency=usd", "request_malformed"),
        (b"amount=10.5&currency=usd&charge=ch_1", "request_malformed"),
        (b"amount=1000&currency=usd&charge=ch%00", "request_malformed"),
        (b"amount=1000&currency=usd&charge=ch_1&extra=1", "request_malformed"),
        (
            b"amount=1000&currency=usd&charge=ch_1&metadata%5Boperation_id%5D=x",
            "injection_conflict",
        ),
        (b"amount=1000&currency=%ff&charge=ch_1", "request_malformed"),
    ],
)
def test_the_lean_gate_refuses_an_ambiguous_form(body: bytes, code: str) -> None:
    """Duplicates, missing or unknown fields, a non-integer amount, NUL, bad UTF-8 and the
    injected field itself are refused with a 4xx before any claim."""
    with pytest.raises(lean_gate.Refused) as refused:
        lean_gate.parse_form(body)
    assert refused.value.code == code
    assert 400 <= refused.value.status < 500


# --------------------------------------------------------------------------- the runner


def test_cpu_lists_use_tasksets_syntax() -> None:
    """0, 0,2 and 0-1 are the cores taskset -c would take."""
    assert runner.cpu_list("0") == (0,)
    assert runner.cpu_list("0-1,3") == (0, 1, 3)
    assert runner.cpu_list("") == ()
    assert runner.counts_list("4,1,2,2") == (1, 2, 4)
    assert runner.counts_list("none") == ()


def test_backends_are_told_apart_by_database_from_the_process_title() -> None:
    """A backend's title names its database; the cluster's own processes name none."""
    backend = runner._PG_BACKEND_TITLE.match(
        "postgres: 15/main: postgres opgate_bench_12 127.0.0.1(52520) idle"
    )
    assert backend is not None
    assert backend.group(1) == "opgate_bench_12"
    local = runner._PG_BACKEND_TITLE.match("postgres: app other_db [local] UPDATE")
    assert local is not None
    assert local.group(1) == "other_db"
    assert runner._PG_BACKEND_TITLE.match("postgres: 15/main: walwriter ") is None
    assert runner._PG_BACKEND_TITLE.match("postgres: 15/main: autovacuum worker db1") is None


def test_a_broken_or_short_lean_chain_invalidates_the_row() -> None:
    """Any bad hash, link, gap, stale head, repeated hash or missing record is a problem."""
    good = {"records": 10, "streams": 2, "bad_hashes": 0, "bad_links": 0, "seq_gaps": 0,
            "stale_heads": 0, "distinct_hashes": 10}  # fmt: skip
    assert runner.chain_problems(good, answered=10) == []
    assert runner.chain_problems(good | {"bad_links": 1}, answered=10) == [
        "audit chain: 1 bad links"
    ]
    assert runner.chain_problems(good, answered=11) == ["audit chain: 10 records for 11 answers"]
    assert runner.chain_problems(good | {"distinct_hashes": 1}, answered=10) == [
        "audit chain: repeated hashes"
    ]


def test_the_ab_summary_is_the_median_of_each_side_and_their_ratio() -> None:
    """bench/ab.py reports each side's median burst and B's medians over A's."""
    sys.path.insert(0, str(REPO / "bench"))  # ab.py imports run.py as the script folder's own
    try:
        ab = bench_module("ab")
    finally:
        sys.path.remove(str(REPO / "bench"))

    def burst(opgate_ms: float) -> dict[str, float]:
        return {"rps": 100.0, "opgate_ms": opgate_ms, "pg_ms": 1.0, "machine_ms": 2.0}

    a = ab.Side("A", REPO, "postgresql://a", samples={"b": [burst(3.0), burst(1.0), burst(2.0)]})
    b = ab.Side("B", REPO, "postgresql://b", samples={"b": [burst(9.0), burst(1.5), burst(1.0)]})
    args = ab.argparse.Namespace(a_env=[], b_env=["OPGATE_POOL_MAX_SIZE=4"], rounds=3, seconds=1)
    result = ab.summarise([a, b], ["b"], args)
    assert result["medians"]["A"]["b"]["opgate_ms"] == 2.0
    assert result["medians"]["B"]["b"]["opgate_ms"] == 1.5
    assert result["b_over_a"]["b"] == {
        "rps": 1.0,
        "opgate_ms": 0.75,
        "pg_ms": 1.0,
        "machine_ms": 1.0,
    }
