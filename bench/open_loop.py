"""An open-loop load generator: request i is sent at t0 + i/rate whatever happened before it,
and its latency is measured from that SCHEDULED time.

wrk is closed-loop: each connection sends its next request only when the previous answer has
arrived, so when the server stalls, wrk stops sending and the requests that a real client would
have sent meanwhile are never measured (coordinated omission): its percentiles describe the
server's service time at whatever rate it chose to run, not what clients see at a given rate.
Here the rate is fixed, a request that cannot go out on time is counted as late, and its
latency includes the delay.

It never waits for a free connection while it can open one: ``--connections`` are opened before
t0, and whenever a request is due and none is idle, another is opened (up to
``--max-connections``; beyond that requests queue, and say so in ``queued_for_connection``).
Every request is built before t0, so the schedule loop only writes bytes. Standard library only
(asyncio protocols and a minimal HTTP/1.1 response parser: Content-Length, chunked, or
close-delimited), so it is cheap enough to measure with: it reports its own CPU.

    python bench/open_loop.py --url http://127.0.0.1:PORT/path --rate 200 --duration 10
        [--method POST --body 'a=1' --header 'Authorization: Bearer x' ...]
        [--ids-base N]  (X-Operation-Id: N, N+1, ... one per request, warm-up included)
        [--warmup 1] [--connections 32] [--max-connections 1024] [--timeout 10]

Prints one line ``OPEN_LOOP_JSON {...}`` (bench/run.py parses it): counts per status, errors,
latency percentiles from the scheduled time (p50, p90, p99, p99.9, max, in microseconds), the
same from the actual send (service time), how many requests went out late and by how much, the
connections it needed, and its own CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import resource
import sys
import urllib.parse
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# A request counts as late when it left more than this after its scheduled time. asyncio's timers
# wake up to a millisecond after their time (epoll's timeout is rounded up to whole
# milliseconds): every request of every row carries that, so only beyond it is lateness.
LATE_AFTER_SECONDS = 0.002


def scheduled_offsets(rate: float, count: int) -> list[float]:
    """Seconds after t0 at which request i is due: i / rate, independent of any answer."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    return [i / rate for i in range(count)]


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (the value at rank ceil(pct/100 * n)); 0 for no values."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(pct / 100 * len(sorted_values)) - 1))
    return float(sorted_values[index])


def latency_summary_us(seconds: Sequence[float]) -> dict[str, float]:
    values = sorted(seconds)
    return {
        "p50": round(percentile(values, 50) * 1e6, 1),
        "p90": round(percentile(values, 90) * 1e6, 1),
        "p99": round(percentile(values, 99) * 1e6, 1),
        "p99_9": round(percentile(values, 99.9) * 1e6, 1),
        "max": round((values[-1] if values else 0.0) * 1e6, 1),
        "mean": round((sum(values) / len(values) if values else 0.0) * 1e6, 1),
    }


class MalformedResponse(ValueError):
    """The server's bytes are not an HTTP/1.1 response this parser can delimit."""


@dataclass(frozen=True)
class ParsedResponse:
    status: int
    consumed: int  # bytes of the buffer that belong to this response
    keep_alive: bool


def parse_response(buffer: bytes, *, closed: bool = False) -> ParsedResponse | None:
    """The first complete response in ``buffer``, or None if more bytes are needed. A response
    with neither Content-Length nor chunked encoding ends when the connection closes
    (``closed``). Raises MalformedResponse for anything else."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buffer[:end].decode("latin-1").split("\r\n")
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise MalformedResponse(f"bad status line {head[0]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in head[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise MalformedResponse(f"bad header line {line!r}")
        headers[name.strip().lower()] = value.strip()
    keep_alive = headers.get("connection", "").lower() != "close" and parts[0] == "HTTP/1.1"
    body_start = end + 4
    if status in (204, 304) or 100 <= status < 200:
        return ParsedResponse(status, body_start, keep_alive)
    if "chunked" in headers.get("transfer-encoding", "").lower():
        position = body_start
        while True:
            line_end = buffer.find(b"\r\n", position)
            if line_end < 0:
                return None
            size_text = buffer[position:line_end].split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError as exc:
                raise MalformedResponse(f"bad chunk size {size_text!r}") from exc
            if size == 0:
                trailer_end = buffer.find(b"\r\n\r\n", line_end)
                if buffer[line_end : line_end + 4] == b"\r\n\r\n":
                    return ParsedResponse(status, line_end + 4, keep_alive)
                if trailer_end < 0:
                    return None
                return ParsedResponse(status, trailer_end + 4, keep_alive)
            position = line_end + 2 + size + 2
            if len(buffer) < position:
                return None
    if "content-length" in headers:
        length = headers["content-length"]
        if not length.isdigit():
            raise MalformedResponse(f"bad Content-Length {length!r}")
        if len(buffer) < body_start + int(length):
            return None
        return ParsedResponse(status, body_start + int(length), keep_alive)
    if closed:
        return ParsedResponse(status, len(buffer), False)
    return None


def build_request(
    method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes
) -> tuple[bytes, bytes]:
    """The request's bytes split around where an X-Operation-Id value goes (prefix, suffix):
    ``prefix + id + suffix`` for a request naming an operation, ``prefix + suffix`` without."""
    parts = urllib.parse.urlsplit(url)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    lines = [f"{method} {target} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    head = "\r\n".join(lines) + "\r\n"
    return head.encode("latin-1"), b"\r\n" + body


@dataclass
class Request:
    index: int
    scheduled: float
    data: bytes
    sent: float = 0.0
    done: float = 0.0
    status: int = 0
    error: str = ""
    waited_for_connection: bool = False


@dataclass
class Generator:
    host: str
    port: int
    max_connections: int
    idle: deque[Connection] = field(default_factory=deque)
    queued: deque[Request] = field(default_factory=deque)
    open_connections: int = 0
    opened_total: int = 0
    connecting: int = 0
    outstanding: int = 0
    max_outstanding: int = 0  # the backlog's peak: requests sent or due and not yet answered
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self.open_connections += 1
        self.opened_total += 1
        self.connecting += 1
        try:
            _, connection = await loop.create_connection(
                lambda: Connection(self), self.host, self.port
            )
        except OSError as exc:
            self.open_connections -= 1
            self.connecting -= 1
            if self.queued:
                self.finish(self.queued.popleft(), error=f"connect: {exc}")
            return
        self.connecting -= 1
        self.release(connection)

    def start(self, request: Request, now: float) -> None:
        """Sends ``request`` now on an idle connection, or opens one for it (it then waits for
        the connect), or, at the connection limit, queues it for the next one freed."""
        self.outstanding += 1
        self.max_outstanding = max(self.max_outstanding, self.outstanding)
        if self.idle:
            self.idle.popleft().send(request, now)
            return
        request.waited_for_connection = True
        self.queued.append(request)
        if self.open_connections < self.max_connections:
            asyncio.get_running_loop().create_task(self.open())

    def release(self, connection: Connection) -> None:
        if self.queued:
            connection.send(self.queued.popleft(), asyncio.get_running_loop().time())
        else:
            self.idle.append(connection)

    def lost(self, connection: Connection) -> None:
        self.open_connections -= 1
        with contextlib.suppress(ValueError):  # it was busy, not idle
            self.idle.remove(connection)
        if self.queued and self.open_connections < self.max_connections:
            asyncio.get_running_loop().create_task(self.open())

    def finish(self, request: Request, *, status: int = 0, error: str = "") -> None:
        request.done = asyncio.get_running_loop().time()
        request.status, request.error = status, error
        self.outstanding -= 1
        if self.outstanding == 0:
            self.all_done.set()


class Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.current: Request | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: Request, now: float) -> None:
        assert self.transport is not None
        request.sent = now
        self.current = request
        self.transport.write(request.data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._complete(closed=False)

    def _complete(self, *, closed: bool) -> None:
        if self.current is None:
            return
        try:
            parsed = parse_response(self.buffer, closed=closed)
        except MalformedResponse as exc:
            request, self.current = self.current, None
            self.generator.finish(request, error=f"malformed: {exc}")
            if self.transport is not None:
                self.transport.close()
            return
        if parsed is None:
            return
        request, self.current = self.current, None
        self.buffer = self.buffer[parsed.consumed :]
        self.generator.finish(request, status=parsed.status)
        if parsed.keep_alive and not closed:
            self.generator.release(self)
        elif self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self._complete(closed=True)
        if self.current is not None:
            request, self.current = self.current, None
            self.generator.finish(request, error="connection closed before the answer")
        self.generator.lost(self)


@dataclass(frozen=True)
class Plan:
    url: str
    method: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    rate: float
    duration: float
    warmup: float
    ids_base: int | None
    connections: int
    max_connections: int
    timeout: float


def requests_for(plan: Plan) -> list[Request]:
    """Every request of the run (warm-up first), built before t0."""
    count = round(plan.rate * (plan.warmup + plan.duration))
    prefix, suffix = build_request(plan.method, plan.url, plan.headers, plan.body)
    requests = []
    for index, offset in enumerate(scheduled_offsets(plan.rate, count)):
        if plan.ids_base is None:
            data = prefix + suffix
        else:
            data = prefix + f"X-Operation-Id: {plan.ids_base + index}\r\n".encode() + suffix
        requests.append(Request(index, offset, data))
    return requests


async def run(plan: Plan) -> dict[str, Any]:
    parts = urllib.parse.urlsplit(plan.url)
    generator = Generator(parts.hostname or "127.0.0.1", parts.port or 80, plan.max_connections)
    requests = requests_for(plan)
    warm = round(plan.rate * plan.warmup)
    await asyncio.gather(*(generator.open() for _ in range(plan.connections)))
    if generator.open_connections == 0:
        raise SystemExit(f"open_loop: cannot connect to {plan.url}")
    loop = asyncio.get_running_loop()
    t0 = loop.time() + 0.05
    for request in requests:
        request.scheduled += t0
    cpu_before: resource.struct_rusage | None = None
    measured_from = t0 + warm / plan.rate
    for request in requests:
        delay = request.scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if cpu_before is None and request.index >= warm:
            cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        generator.start(request, loop.time())
    last = requests[-1].scheduled if requests else t0
    if generator.outstanding:
        generator.all_done.clear()  # set whenever nothing was in flight between two sends
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                generator.all_done.wait(), timeout=max(0.0, last + plan.timeout - loop.time())
            )
    ended = loop.time()
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    result = summarise(
        requests[warm:], generator, cpu_before or cpu_after, cpu_after, measured_from, ended, plan
    )
    # How long after the last scheduled request the last answer came: far above the service
    # time, the server was beyond its capacity at this rate and the backlog grew all along.
    result["drain_ms"] = round((ended - last) * 1000, 1)
    return result


def summarise(
    measured: list[Request],
    generator: Generator,
    cpu_before: resource.struct_rusage,
    cpu_after: resource.struct_rusage,
    started: float,
    ended: float,
    plan: Plan,
) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    from_schedule, from_send, lateness = [], [], []
    unanswered = 0
    for request in measured:
        if request.done == 0.0:
            unanswered += 1
            continue
        if request.error:
            errors[request.error.split(":", 1)[0]] += 1
        else:
            statuses[str(request.status)] += 1
        from_schedule.append(request.done - request.scheduled)
        if request.sent:
            from_send.append(request.done - request.sent)
            lateness.append(request.sent - request.scheduled)
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    late = [x for x in lateness if x > LATE_AFTER_SECONDS]
    span = max(ended - started, 1e-9)
    return {
        "rate": plan.rate,
        "duration_s": plan.duration,
        "scheduled": len(measured),
        "completed": len(from_schedule),
        "unanswered_after_timeout": unanswered,
        "statuses": dict(statuses),
        "errors": dict(errors),
        "latency_us": latency_summary_us(from_schedule),
        "service_time_us": latency_summary_us(from_send),
        "late": {
            "threshold_us": LATE_AFTER_SECONDS * 1e6,
            "count": len(late),
            "over_10ms": sum(1 for x in lateness if x > 0.010),
            "p99_us": round(percentile(sorted(lateness), 99) * 1e6, 1),
            "max_us": round(max(lateness, default=0.0) * 1e6, 1),
        },
        "queued_for_connection": sum(1 for r in measured if r.waited_for_connection),
        "max_in_flight": generator.max_outstanding,
        "connections": {"initial": plan.connections, "opened": generator.opened_total},
        "ids_used": round(plan.rate * (plan.warmup + plan.duration)) if plan.ids_base else 0,
        "generator_cpu": {
            "ms_per_request": round(1000 * cpu / max(len(measured), 1), 4),
            "percent_of_one_core": round(100 * cpu / span, 1),
        },
    }


def parse_args(argv: Sequence[str] | None) -> Plan:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--method", default="GET")
    parser.add_argument("--body", default="")
    parser.add_argument("--header", action="append", default=[], help="'Name: value'")
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds at the same rate first")
    parser.add_argument("--ids-base", type=int, default=None)
    parser.add_argument("--connections", type=int, default=32, help="opened before t0")
    parser.add_argument("--max-connections", type=int, default=1024)
    parser.add_argument("--timeout", type=float, default=10.0, help="after the last request")
    args = parser.parse_args(argv)
    headers = []
    for text in args.header:
        name, sep, value = text.partition(":")
        if not sep:
            parser.error(f"--header {text!r} is not 'Name: value'")
        headers.append((name.strip(), value.strip()))
    return Plan(
        url=args.url,
        method=args.method,
        headers=tuple(headers),
        body=args.body.encode(),
        rate=args.rate,
        duration=args.duration,
        warmup=args.warmup,
        ids_base=args.ids_base,
        connections=args.connections,
        max_connections=args.max_connections,
        timeout=args.timeout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    plan = parse_args(argv)
    result = asyncio.run(run(plan))
    print("OPEN_LOOP_JSON " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
