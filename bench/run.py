"""opgate's throughput benchmark: every row measured side by side, in one run, on one machine.

    python bench/run.py [--duration 10] [--connections 16] [--profile [b|a|c|b,a,c]] [--no-lean]
                        [--workers-counts 1,2,4] [--pinned-workers-counts 1,2]
                        [--fixed-rates 200,500]  (README.md: every option)

Rows (all on loopback, the same wrk script and settings for every HTTP row):

- direct GET/POST: wrk straight to the fake provider (bench/provider.py): the upstream's limit.
- baseline GET/POST: through a bare aiohttp forwarding proxy (bench/baseline_proxy.py): what any
  Python proxy costs here, the reference opgate is judged against.
- opgate (a) read: GET through opgate on a rule with ``operation: none`` (no database).
- opgate (b) operation: POST /v1/refunds, every request a distinct pre-approved operation, end to
  end (load the row, checks, claim, forward, settle, audit line).
- opgate (c) rejection: a wrong amount against an existing operation (422 amount_mismatch).
- lean gate (b): the same requests against bench/lean_gate.py, the same durable work (claim
  committed before the send, settle with one SHA-256 chained audit record) written directly:
  what (b)'s durable work costs without opgate's structure.
- pgbench claim+settle: the two transition statements opgate runs for (b), taken verbatim from
  proxy/store/queries.sql, on fresh rows: the database's own limit.
- fixed-rate rows: baseline POST, opgate (b) and the lean gate at constant arrival rates
  (bench/open_loop.py, open loop: latency from the scheduled time, no coordinated omission).
- the workers dimension: (b) again against `opgate serve` with OPGATE_WORKERS=1, 2, N... (one
  at a time, each started and stopped separately), as ratios to baseline POST and to pgbench;
  then 1 and 2 workers pinned to their own cores, wrk, the provider and the bench database's
  backends to the others.

Every listener is on a free port and opgate's forward-proxy listener is off, so the bench runs
while another opgate (``./dev serve``) holds the default ports.

Why it is built this way:

- Comparisons are only meaningful within one run: on a 2-core machine the figures drift between
  runs (CPU frequency, neighbours), so the ratios are what the report leans on.
- The runner itself uses only the standard library (psql/pgbench/wrk as subprocesses, urllib for
  the pre-checks), so ``python bench/run.py`` works with any Python 3.11; the servers it starts
  run under the project's venv (``--python``).
- Each HTTP row is checked with one request before it is loaded, so a misconfiguration is
  reported with the server's answer instead of as a wall of non-2xx. A row with any socket error
  or unexpected status is marked invalid and the command exits non-zero.
- CPU seconds per process (/proc) are recorded for every row, so the report can say where the
  time goes (proxy, provider, PostgreSQL, wrk) without a profiler; ``--profile`` adds py-spy.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
LUA_SCRIPT = BENCH_DIR / "wrk" / "bench.lua"
# The interpreter the servers run under: the repository's own venv (what ./dev creates), else
# the shared one of this test bed, else the runner's own.
PYTHON_CANDIDATES = (REPO / ".venv" / "bin" / "python", Path("/work/venv/bin/python"))

TENANT = "t1"
AGENT_ID = "bench"
PROVIDER = "bench"
AMOUNT = 1000
REFUND_BODY = f"amount={AMOUNT}&currency=usd&charge=ch_bench"
REJECT_BODY = f"amount={AMOUNT - 1}&currency=usd&charge=ch_bench"
READ_PATH = "/v1/refunds/re_bench_0"
# Operation ids are decimal strings so that wrk's Lua and pgbench can compute them, and the
# ranges below never overlap (each is far larger than any run can use; checked at allocation).
REJECT_OPERATION_ID = 1
RANGE_SIZE = 10_000_000
RANGES = {
    "warmup": 10_000_000,
    "measure": 20_000_000,
    "profile": 30_000_000,
    "pgbench": 40_000_000,
    "lean_warmup": 50_000_000,
    "lean_measure": 60_000_000,
}
FIXED_RATE_RANGES_START = 80_000_000  # then FIXED_RATE_BLOCK ids per fixed-rate row
FIXED_RATE_BLOCK = 1_000_000
WORKERS_RANGES_START = 100_000_000  # then one RANGE_SIZE per workers row
# A generous upper bound on claim+settle pairs per second, used to size pgbench's fresh rows.
PGBENCH_MAX_TPS = 8_000

POLICY_TEMPLATE = """\
# The benchmark's provider, shaped like policies/stripe.yaml (written by bench/run.py).
version: 1
provider: {provider}
route_prefix: /bench
upstream: {upstream}
credential:
  header: Authorization
  scheme: Bearer
  secret: bench_key
idempotency:
  header: Idempotency-Key
  provider_deduplicates: true
  retention_seconds: 86400
metadata_injection:
  kind: form_field
  field: metadata[operation_id]
timeouts:
  connect_seconds: 5
  total_seconds: 30
forward_headers: [Accept, User-Agent]
classify:
  confirmed: [2xx]
  failed: [400, 402, 404]
  object_id: /id
rules:
  - name: refund.create
    method: POST
    path: /v1/refunds
    body: form
    amount: amount
    currency: currency
    params: [charge]
  - name: read
    method: GET
    path: /v1/{{resource...}}
    operation: none
    body: none
"""


class BenchError(RuntimeError):
    """The benchmark could not run (a server did not start, a pre-check failed...)."""


# ---------------------------------------------------------------------------------------------
# Configuration and results


@dataclass(frozen=True)
class Config:
    duration: int
    connections: int
    threads: int
    warmup: int
    pgbench_clients: int
    admin_url: str
    python: str
    profile: bool
    profile_seconds: int
    keep_database: bool
    workers_counts: tuple[int, ...]  # the workers dimension; () skips it
    workers_duration: int
    profile_rows: tuple[str, ...] = ("b",)  # --profile's: b operation, a read, c rejection
    lean: bool = True  # the lean durable gate row (bench/lean_gate.py)
    fixed_rates: tuple[float, ...] = (200.0, 500.0)  # open-loop rows; () skips them
    fixed_targets: tuple[str, ...] = ("baseline", "opgate", "lean")
    fixed_duration: int = 8
    fixed_pin: bool = True  # open-loop generator on the last core, the server off it
    pinned_workers_counts: tuple[int, ...] = (1, 2)  # workers rows with the CPU split
    workers_cpus: tuple[int, ...] = ()  # the opgate workers' cores in the split; () = first half
    workers_connections: int = 0  # wrk connections of the workers rows; 0 = --connections


@dataclass
class CpuUse:
    """CPU milliseconds per request, by who spent them."""

    proxy: float | None
    proxy_kernel_share: float | None  # of the proxy's CPU, the part spent in the kernel
    provider: float | None
    postgres: float | None
    load_generator: float | None
    other_processes: dict[str, float]  # the largest other consumers, by process name
    interrupts: float  # kernel irq + softirq time (loopback TCP), in no process's account
    steal: float  # taken by the hypervisor: not ours, but it shrinks what is left for us
    machine: float  # all cores, all processes, including the two above
    machine_busy_percent: float  # of all cores
    # this run's own share of the machine: proxy + provider + pg + load generator + interrupts,
    # without the other processes (other users' test suites on a shared machine)
    ours: float = 0.0


@dataclass
class Row:
    key: str
    label: str
    requests: int
    rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    statuses: dict[str, int]
    socket_errors: int
    expected_status: int
    valid: bool
    problems: list[str] = field(default_factory=list)
    cpu_ms_per_request: CpuUse | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    """A port nobody listens on now. The tiny race until the child binds it is acceptable on a
    dedicated loopback bench; it lets every process be configured by plain flags/env vars."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    stderr_path: Path

    def stderr_tail(self, lines: int = 30) -> str:
        try:
            text = self.stderr_path.read_text("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def start_service(
    stack: contextlib.ExitStack,
    name: str,
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    logs: Path,
    cwd: Path = REPO,
) -> Service:
    """Starts a server whose stdout goes to /dev/null (opgate's audit line: one JSON line per
    request, rendered and written all the same, so its cost is measured) and whose stderr goes to
    a file, and registers its stop on ``stack`` so that it is stopped on every exit path."""
    stderr_path = logs / f"{name}.stderr.log"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            list(argv), stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=cwd
        )
    service = Service(name, process, stderr_path)
    stack.callback(stop_process, process)
    return service


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM (every server here stops cleanly on it), then SIGKILL if it hangs."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_call(
    method: str, url: str, body: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    """One request, never through an environment proxy; any status is an answer."""
    data = body.encode() if body is not None else None
    # S310: every URL here is an http://127.0.0.1 address this runner built itself.
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})  # noqa: S310
    try:
        with _NO_PROXY_OPENER.open(request, timeout=10) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode("utf-8", "replace")


def wait_ready(service: Service, url: str, timeout: float = 30.0) -> None:
    """Polls ``url`` until it answers 200, the process dies, or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if service.process.poll() is not None:
            raise BenchError(
                f"{service.name} exited with {service.process.returncode} before it was ready:\n"
                f"{service.stderr_tail()}"
            )
        try:
            status, body = http_call("GET", url)
            if status == 200:
                return
            last = f"{status} {body[:200]}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.05)
    raise BenchError(
        f"{service.name} not ready at {url} after {timeout}s ({last}):\n{service.stderr_tail()}"
    )


# ---------------------------------------------------------------------------------------------
# PostgreSQL (through psql, so that the runner needs no driver)


def database_url(admin_url: str, name: str) -> str:
    parts = urllib.parse.urlsplit(admin_url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def psql(url: str, sql: str) -> str:
    result = subprocess.run(
        ["psql", url, "-v", "ON_ERROR_STOP=1", "-X", "-A", "-t", "-q", "-c", sql],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BenchError(f"psql failed ({sql[:80]}...): {result.stderr.strip()}")
    return result.stdout.strip()


@contextlib.contextmanager
def bench_database(admin_url: str, keep: bool, suffix: str = "") -> Iterator[str]:
    """A fresh database for this run, dropped afterwards (FORCE: opgate may still be connected
    if it failed to stop)."""
    name = f"opgate_bench_{os.getpid()}{suffix}"
    _BENCH_DATABASE.append(name)
    psql(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    psql(admin_url, f"CREATE DATABASE {name}")
    try:
        yield database_url(admin_url, name)
    finally:
        if not keep:
            psql(admin_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def insert_operations(db_url: str, first: int, count: int, *, amount: int = AMOUNT) -> None:
    """``count`` approved refund operations with ids first..first+count-1, in one statement:
    the approval API is not what is measured. Then VACUUM ANALYZE, so every run starts from a
    table with fresh statistics and a visibility map, not from whatever the previous run left."""
    psql(
        db_url,
        f"""
        INSERT INTO operations (
            operation_id, tenant, agent_id, provider, action, method, path,
            amount, currency, params, idempotency_key, approval_ref, approved_by, expires_at)
        SELECT g::text, '{TENANT}', NULL, '{PROVIDER}', 'refund.create', 'POST', '/v1/refunds',
               {amount}, 'usd', '{{"charge": "ch_bench"}}'::jsonb, 'bench-key-' || g,
               'bench', 'bench', now() + interval '1 day'
          FROM generate_series({first}::bigint, {first + count - 1}::bigint) AS g
        """,
    )
    psql(db_url, "VACUUM ANALYZE operations")
    psql(db_url, "VACUUM ANALYZE audit_log")


def status_counts(db_url: str, first: int, count: int) -> dict[str, int]:
    rows = psql(
        db_url,
        f"SELECT status, count(*) FROM operations "
        f"WHERE operation_id ~ '^[0-9]+$' AND operation_id::bigint "
        f"BETWEEN {first} AND {first + count - 1} GROUP BY status",
    )
    counts: dict[str, int] = {}
    for line in rows.splitlines():
        status, number = line.split("|")
        counts[status] = int(number)
    return counts


# ---------------------------------------------------------------------------------------------
# CPU accounting from /proc


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    split = process_user_system_seconds(pid)
    return None if split is None else split[0] + split[1]


def process_user_system_seconds(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds of ``pid`` and its live descendants (``opgate serve`` with
    several workers is a supervisor and its forked workers): system is the kernel's share
    (socket syscalls, loopback TCP)."""
    user = system = 0.0
    for member in process_family(pid):
        try:
            text = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            if member == pid:
                return None
            continue
        fields = text.rsplit(")", 1)[1].split()
        user += int(fields[11]) / _CLOCK_TICKS
        system += int(fields[12]) / _CLOCK_TICKS
    return user, system


def process_family(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc/<pid>/task/<tid>/children."""
    family, pending = [], [pid]
    while pending:
        member = pending.pop()
        family.append(member)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{member}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
    return family


def usable_cpus() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def pin_process(pid: int, cpus: Sequence[int]) -> int:
    """Sets the CPU affinity of every thread of ``pid`` and of its descendants (taskset -a -p);
    returns how many threads were set. A thread that exits meanwhile is skipped."""
    pinned = 0
    for member in process_family(pid):
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{member}/task").iterdir():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task.name), set(cpus))
                    pinned += 1
    return pinned


def bench_backends(db_url: str) -> list[int]:
    """The PostgreSQL backends connected to the bench database (the servers' pools): the only
    postgres processes the bench pins. The cluster's shared processes (WAL writer,
    checkpointer...) and other databases' backends serve other users of this machine too."""
    text = psql(
        db_url,
        "SELECT pid FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    return [int(line) for line in text.splitlines() if line.strip()]


# The bench database's name, once created: PostgreSQL backends of OTHER databases (other users'
# test suites on a shared machine) are not counted in the pg column.
_BENCH_DATABASE: list[str] = []
# A backend's process title: "postgres: [<cluster>: ]<user> <database> <host>(<port>)|[local] ..."
_PG_BACKEND_TITLE = re.compile(r"^postgres: (?:\S+: )?\S+ (\S+) (?:\S+\(\d+\)|\[local\])")
OTHER_DATABASES = "postgres (other databases)"


def postgres_kind(pid: int) -> str:
    """``postgres`` for a backend of the bench database or one of the cluster's own processes
    (WAL writer, checkpointer, autovacuum...: shared, but mostly working for the bench while it
    runs), OTHER_DATABASES for a backend of any other database."""
    try:
        title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return "postgres"
    match = _PG_BACKEND_TITLE.match(title)
    if match is None or not _BENCH_DATABASE or match.group(1) in _BENCH_DATABASE:
        return "postgres"
    return OTHER_DATABASES


def all_processes_cpu_seconds() -> dict[int, tuple[str, float]]:
    """(name, CPU seconds) of every process, kernel threads included: PostgreSQL's backends and
    the kernel's writeback/journal threads that its fsyncs wake are part of a row's cost."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        comm = text[text.find("(") + 1 : text.rfind(")")]
        if comm == "postgres":
            comm = postgres_kind(int(entry.name))
        fields = text.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (comm, (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS)
    return found


@dataclass(frozen=True)
class MachineCpu:
    busy: float
    total: float
    interrupts: float
    steal: float


def machine_cpu_seconds() -> MachineCpu:
    """CPU seconds of the whole machine, all cores, from the first line of /proc/stat
    (user nice system idle iowait irq softirq steal ...)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values[:8])  # guest time is already counted in user
    return MachineCpu(
        busy=(total - idle) / _CLOCK_TICKS,
        total=total / _CLOCK_TICKS,
        interrupts=(values[5] + values[6]) / _CLOCK_TICKS,
        steal=values[7] / _CLOCK_TICKS,
    )


@dataclass
class CpuSnapshot:
    proxy_pid: int | None
    provider_pid: int | None
    proxy: float | None
    proxy_system: float | None
    provider: float | None
    processes: dict[int, tuple[str, float]]
    children: float
    machine: MachineCpu

    @classmethod
    def take(cls, proxy_pid: int | None, provider_pid: int | None) -> CpuSnapshot:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return cls(
            proxy_pid=proxy_pid,
            provider_pid=provider_pid,
            proxy=process_cpu_seconds(proxy_pid) if proxy_pid else None,
            proxy_system=(process_user_system_seconds(proxy_pid) or (0.0, 0.0))[1]
            if proxy_pid
            else None,
            provider=process_cpu_seconds(provider_pid) if provider_pid else None,
            processes=all_processes_cpu_seconds(),
            children=usage.ru_utime + usage.ru_stime,
            machine=machine_cpu_seconds(),
        )


def cpu_use(before: CpuSnapshot, after: CpuSnapshot, requests: int) -> CpuUse:
    """Per-request CPU between two snapshots. Postgres processes that appeared during the run
    count in full; ones that exited during it are lost (only pgbench's own backends do that)."""
    per = 1000.0 / max(requests, 1)

    def delta(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * per, 4)

    skip = {p for p in (after.provider_pid,) if p}
    if after.proxy_pid:
        skip.update(process_family(after.proxy_pid))
    postgres = 0.0
    others: dict[str, float] = {}
    for pid, (comm, cpu) in after.processes.items():
        if pid in skip:
            continue
        spent = cpu - before.processes.get(pid, (comm, 0.0))[1]
        if comm == "postgres":
            postgres += spent
        else:
            kind = comm if comm == OTHER_DATABASES else re.split(r"[/:]", comm)[0]  # kworker/1:2H
            others[kind] = others.get(kind, 0.0) + spent
    machine = after.machine.busy - before.machine.busy
    wall = after.machine.total - before.machine.total
    kernel_share = None
    proxy_ms = delta(before.proxy, after.proxy)
    kernel_ms = delta(before.proxy_system, after.proxy_system)
    if proxy_ms and kernel_ms is not None:
        kernel_share = round(kernel_ms / proxy_ms, 3)
    provider_ms = delta(before.provider, after.provider)
    # wrk (or the open-loop generator) is the only child reaped while a row runs, so the
    # children's rusage delta is the load generator's
    load_ms = round((after.children - before.children) * per, 4)
    interrupts_ms = round((after.machine.interrupts - before.machine.interrupts) * per, 4)
    ours = (proxy_ms or 0.0) + (provider_ms or 0.0) + postgres * per + load_ms + interrupts_ms
    return CpuUse(
        proxy=proxy_ms,
        proxy_kernel_share=kernel_share,
        provider=provider_ms,
        postgres=round(postgres * per, 4),
        load_generator=load_ms,
        other_processes={
            name: round(cpu * per, 4)
            for name, cpu in sorted(others.items(), key=lambda item: -item[1])[:4]
            if cpu * per >= 0.005
        },
        interrupts=interrupts_ms,
        steal=round((after.machine.steal - before.machine.steal) * per, 4),
        machine=round(machine * per, 4),
        machine_busy_percent=round(100.0 * machine / wall, 1) if wall > 0 else 0.0,
        ours=round(ours, 4),
    )


# ---------------------------------------------------------------------------------------------
# wrk


@dataclass(frozen=True)
class WrkTarget:
    key: str
    label: str
    method: str
    url: str
    body: str = ""
    token: str = ""
    operation_id: str = ""
    expected_status: int = 200
    proxy_pid: int | None = None  # the server under test, for the CPU attribution
    provider_pid: int | None = None
    load_cpus: tuple[int, ...] = ()  # run the load generator on these cores only (taskset)


def taskset_prefix(cpus: Sequence[int]) -> list[str]:
    """``taskset -c`` for a command pinned to ``cpus`` (nothing when it is not pinned)."""
    return ["taskset", "-c", ",".join(str(c) for c in cpus)] if cpus else []


def wrk_argv(
    config: Config, target: WrkTarget, seconds: int, ids: tuple[int, int] | None
) -> list[str]:
    parts = urllib.parse.urlsplit(target.url)
    base_url = f"{parts.scheme}://{parts.netloc}"
    script_args = [
        f"method={target.method}",
        f"path={parts.path}",
        f"body={target.body}",
        f"token={target.token}",
        f"op={target.operation_id}",
    ]
    if ids is not None:
        script_args += [f"base={ids[0]}", f"per={ids[1]}"]
    return [
        *taskset_prefix(target.load_cpus),
        "wrk",
        "-t", str(config.threads),
        "-c", str(config.connections),
        "-d", f"{seconds}s",
        "--timeout", "5s",
        "-s", str(LUA_SCRIPT),
        base_url,
        "--",
        *script_args,
    ]  # fmt: skip


def run_wrk(
    config: Config, target: WrkTarget, seconds: int, ids: tuple[int, int] | None = None
) -> tuple[dict[str, Any], CpuUse]:
    before = CpuSnapshot.take(target.proxy_pid, target.provider_pid)
    result = subprocess.run(
        wrk_argv(config, target, seconds, ids), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise BenchError(f"wrk failed for {target.label}: {result.stderr.strip()}")
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("BENCH_JSON ")), None)
    if line is None:
        raise BenchError(f"wrk printed no summary for {target.label}:\n{result.stdout}")
    summary: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
    after = CpuSnapshot.take(target.proxy_pid, target.provider_pid)
    return summary, cpu_use(before, after, int(summary["requests"]))


def precheck(target: WrkTarget, operation_id: str | None = None) -> str:
    """One request before the load, so a misconfigured row fails with the server's answer."""
    headers: dict[str, str] = {}
    if target.body:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    if target.token:
        headers["Authorization"] = f"Bearer {target.token}"
    if operation_id or target.operation_id:
        headers["X-Operation-Id"] = operation_id or target.operation_id
    status, body = http_call(target.method, target.url, target.body or None, headers)
    if status != target.expected_status:
        raise BenchError(
            f"{target.label}: pre-check answered {status}, expected {target.expected_status}: "
            f"{body[:500]}"
        )
    return body


def measure(config: Config, target: WrkTarget, ids: tuple[int, int] | None = None) -> Row:
    summary, cpu = run_wrk(config, target, config.duration, ids)
    duration_s = summary["duration_us"] / 1e6
    statuses = {str(k): int(v) for k, v in summary["statuses"].items()}
    socket_errors = sum(int(v) for v in summary["socket_errors"].values())
    problems: list[str] = []
    unexpected = {s: n for s, n in statuses.items() if int(s) != target.expected_status}
    if unexpected:
        problems.append(f"unexpected statuses {unexpected} (expected {target.expected_status})")
    if socket_errors:
        problems.append(f"socket errors {summary['socket_errors']}")
    if summary["requests"] == 0:
        problems.append("no request completed")
    latency = summary["latency_us"]
    return Row(
        key=target.key,
        label=target.label,
        requests=int(summary["requests"]),
        rps=round(summary["requests"] / duration_s, 1),
        p50_ms=round(latency["p50"] / 1000, 3),
        p99_ms=round(latency["p99"] / 1000, 3),
        mean_ms=round(latency["mean"] / 1000, 3),
        statuses=statuses,
        socket_errors=socket_errors,
        expected_status=target.expected_status,
        valid=not problems,
        problems=problems,
        cpu_ms_per_request=cpu,
        extra={"sent_ids": summary["sent_ids"]} if ids else {},
    )


def id_range(key: str, per_thread: int, threads: int) -> tuple[int, int]:
    if per_thread * threads >= RANGE_SIZE:
        raise BenchError(f"{key}: {per_thread * threads} operations do not fit the id range")
    return RANGES[key], per_thread


# ---------------------------------------------------------------------------------------------
# pgbench


def pgbench_script(tmp: Path, db_url: str) -> Path:
    """claim_operation then settle_operation, verbatim from queries.sql, each its own autocommit
    transaction as in opgate, on a fresh row per script run: client c's n-th run takes row
    base + c*per + n - 1. Running out of rows aborts the client (1/0) instead of silently
    updating nothing.

    Each placeholder becomes a pgbench variable cast to the type PostgreSQL infers for it when
    it prepares the statement (what asyncpg's prepared statement has): pgbench turns every
    *occurrence* of a variable into its own parameter, so a repeated one (``owner`` in the
    event's ``jsonb_build_object``) would otherwise have no type at all. Each variable is named
    ``<prefix>_<parameter>`` after the query's named parameter (``opid``: the operation id)."""
    sys.path.insert(0, str(REPO))
    from proxy.store.queries import load_queries  # stdlib-only module: the SQL opgate runs

    queries = load_queries()

    def with_variables(name: str, prefix: str, literals: dict[str, str] | None = None) -> str:
        query = queries[name]
        sql = query.sql
        types = psql(
            db_url,
            f"PREPARE bench_probe AS {sql}; SELECT unnest(parameter_types)::text "
            f"FROM pg_prepared_statements WHERE name = 'bench_probe'",
        ).splitlines()

        def variable(match: re.Match[str]) -> str:
            number = int(match.group(1))
            parameter = query.parameters[number - 1]
            if literals and parameter in literals:  # a NULL, which no pgbench variable can be
                return f"{literals[parameter]}::{types[number - 1]}"
            name = "opid" if parameter == "operation_id" else f"{prefix}_{parameter}"
            return f":{name}::{types[number - 1]}"

        return re.sub(r"\$(\d+)", variable, sql)

    # A first attempt, as opgate's pipeline claims one: no reconciliation lookup before it, no
    # precondition lookup, the event's actor the owner.
    nothing = {name: "NULL" for name in ("after_lookup_by", "unchanged_since", "actor")}
    claim = with_variables("claim_operation", "claim", nothing)
    settle = with_variables("settle_operation", "settle", {"request": "NULL"})
    script = tmp / "claim_settle.sql"
    script.write_text(
        "\\set next :next + 1\n"
        "\\if :next > :per\n"
        "\\set out_of_rows 1 / 0\n"
        "\\endif\n"
        "\\set opid :base + :client_id * :per + :next - 1\n"
        f"{claim};\n{settle};\n"
    )
    return script


def run_pgbench(config: Config, db_url: str, tmp: Path, script: Path) -> Row:
    clients = config.pgbench_clients
    per = math.ceil(PGBENCH_MAX_TPS * config.duration * 1.5 / clients)
    base = RANGES["pgbench"]
    if per * clients >= RANGE_SIZE:
        raise BenchError("pgbench: too many rows for the id range")
    insert_operations(db_url, base, per * clients)
    psql(db_url, "CHECKPOINT")
    answer = '{"id":"re_bench_1","object":"refund","amount":1000,"status":"succeeded"}'
    owner = "bench-pgbench"
    variables = {
        "next": "0", "per": str(per), "base": str(base),
        # the first attempt (attempts 0), the bench policy's retention_seconds as the window
        "claim_owner": owner, "claim_lease_seconds": "35", "claim_expected_attempts": "0",
        "claim_dedup_window_seconds": "86400",
        "settle_status": "confirmed", "settle_provider_status": "200",
        "settle_object_id": "re_bench_1", "settle_content_type": "application/json",
        "settle_body": answer, "settle_actor": owner,
    }  # fmt: skip
    log_prefix = tmp / "pgbench_log"
    argv = [
        "pgbench", "-n", "-M", "prepared",
        "-c", str(clients), "-j", str(min(clients, config.threads)),
        "-T", str(config.duration), "-f", str(script),
        "--log", f"--log-prefix={log_prefix}",
        *[arg for name, value in variables.items() for arg in ("-D", f"{name}={value}")],
        db_url,
    ]  # fmt: skip
    before = CpuSnapshot.take(None, None)
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    output = result.stdout + result.stderr
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
    if result.returncode != 0 or processed is None or tps is None:
        raise BenchError(f"pgbench failed ({result.returncode}):\n{output}")
    transactions = int(processed.group(1))
    latencies = sorted(
        int(line.split()[2])
        for log in tmp.glob("pgbench_log*")
        for line in log.read_text().splitlines()
        if line.strip()
    )
    after = CpuSnapshot.take(None, None)
    counts = status_counts(db_url, base, per * clients)
    problems: list[str] = []
    if counts.get("confirmed", 0) != transactions:
        problems.append(
            f"{counts.get('confirmed', 0)} rows confirmed for {transactions} transactions"
        )
    failed = re.search(r"number of failed transactions: (\d+)", output)
    if failed and int(failed.group(1)):
        problems.append(f"{failed.group(1)} failed transactions")
    return Row(
        key="pgbench",
        label="pgbench claim+settle",
        requests=transactions,
        rps=round(float(tps.group(1)), 1),
        p50_ms=round(percentile(latencies, 50) / 1000, 3),
        p99_ms=round(percentile(latencies, 99) / 1000, 3),
        mean_ms=round(statistics.fmean(latencies) / 1000, 3) if latencies else 0.0,
        statuses={},
        socket_errors=0,
        expected_status=0,
        valid=not problems,
        problems=problems,
        cpu_ms_per_request=cpu_use(before, after, transactions),
        extra={"clients": clients, "rows_by_status": counts},
    )


def percentile(sorted_values: Sequence[int], pct: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, math.ceil(pct / 100 * len(sorted_values)) - 1))
    return float(sorted_values[index])


# ---------------------------------------------------------------------------------------------
# py-spy


def profile_opgate(
    config: Config,
    target: WrkTarget,
    db_url: str,
    opgate_pid: int,
    rps: float,
    logs: Path,
    *,
    fresh_operations: bool,
) -> dict[str, Any]:
    """Samples opgate with ``py-spy record --gil`` while wrk runs ``target`` again (row (b) on
    fresh operations, or the read); returns the top self and inclusive costs.

    ``--gil`` keeps only the samples in which the sampled thread holds the GIL, i.e. running
    Python: without it, sampling attributes 17-37% of an aiohttp server's samples to
    ``_SelectorSocketTransport.write`` (the thread has just woken its peer and been preempted
    in the send syscall: waiting, not work). Blocking mode (the default: the target is paused
    for each sample, ~1% at 200 Hz) so every stack is consistent. What it cannot show is the
    kernel's share (socket syscalls, loopback TCP): that is the table's kernel share column."""
    py_spy = shutil.which("py-spy") or str(Path(config.python).parent / "py-spy")
    if not Path(py_spy).exists():
        return {"skipped": f"py-spy not found; install it: {config.python} -m pip install py-spy"}
    seconds = config.profile_seconds
    ids: tuple[int, int] | None = None
    if fresh_operations:
        per_thread = math.ceil(max(rps, 500) * seconds * 2 / config.threads) + 500
        ids = id_range("profile", per_thread, config.threads)
        insert_operations(db_url, ids[0], per_thread * config.threads)
    raw = logs / f"opgate-profile-{target.key}.txt"
    spy = subprocess.Popen(
        [py_spy, "record", "--pid", str(opgate_pid), "--duration", str(seconds + 1),
         "--rate", "200", "--gil", "--format", "raw", "--output", str(raw)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        time.sleep(0.5)  # py-spy attaches; the samples before wrk starts are idle ones
        summary, _ = run_wrk(config, target, seconds, ids)
    finally:
        _, spy_err = spy.communicate(timeout=seconds + 30)
    if spy.returncode != 0 or not raw.exists():
        return {"skipped": f"py-spy failed: {spy_err.decode(errors='replace').strip()}"}
    return summarise_profile(raw) | {
        "row": target.label,
        "raw_file": str(raw.relative_to(REPO)),
        "requests_while_profiled": summary["requests"],
        "rps_while_profiled": round(summary["requests"] / (summary["duration_us"] / 1e6), 1),
    }


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def summarise_profile(raw: Path, top: int = 40) -> dict[str, Any]:
    """Self and inclusive sample shares per function and per package from py-spy's collapsed
    stacks (``frame;frame;... count``), idle event-loop waits excluded."""
    self_samples: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    by_package: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [name_frame(f) for f in stack.split(";") if f]
        if not frames:
            continue
        if frames[-1].startswith("select ") or frames[-1].startswith("poll "):
            continue  # the loop waiting in epoll: not work
        total += count
        self_samples[frames[-1]] += count
        for name in set(frames):
            inclusive[name] += count
        by_package[package_of(stack.split(";")[-1])] += count

    def share(counter: Counter[str]) -> list[dict[str, Any]]:
        return [
            {"name": name, "percent": round(100 * n / max(total, 1), 1)}
            for name, n in counter.most_common(top)
        ]

    return {
        "samples": total,
        "self": share(self_samples),
        "inclusive": share(inclusive),
        "self_by_package": share(by_package),
    }


def name_frame(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    file = match.group("file")
    return f"{match.group('func')} ({short_path(file)})"


def short_path(file: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", str(REPO) + "/"):
        if marker in file:
            return file.split(marker, 1)[1]
    return file


def package_of(frame: str) -> str:
    match = _FRAME.match(frame.strip())
    file = short_path(match.group("file")) if match else frame
    if file.startswith("proxy/"):
        return "opgate (proxy/)"
    top = file.split("/", 1)[0]
    return top.removesuffix(".py") if "/" in file or file.endswith(".py") else top


# ---------------------------------------------------------------------------------------------
# The run


def run(config: Config) -> dict[str, Any]:
    for tool in ("wrk", "pgbench", "psql", "taskset"):
        if shutil.which(tool) is None:
            hint = "apt-get update && apt-get install -y wrk" if tool == "wrk" else ""
            raise BenchError(f"{tool} is not installed. {hint}".strip())
    RESULTS_DIR.mkdir(exist_ok=True)
    background = background_load()
    if background["busy_percent"] > 10:
        print(
            f"warning: the machine is {background['busy_percent']}% busy before the bench "
            f"starts ({background['top']}); every figure will be lower and noisier",
            file=sys.stderr,
        )
    rows: dict[str, Row] = {}
    profiles: list[dict[str, Any]] = []
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opgate-bench-")))
        db_url = stack.enter_context(bench_database(config.admin_url, config.keep_database))

        provider_port, baseline_port, agent_port, ops_port, lean_port = (
            free_port() for _ in range(5)
        )
        provider = start_service(
            stack, "provider",
            [config.python, str(BENCH_DIR / "provider.py"), "--port", str(provider_port)],
            logs=RESULTS_DIR,
        )  # fmt: skip
        provider_url = f"http://127.0.0.1:{provider_port}"
        baseline = start_service(
            stack, "baseline",
            [config.python, str(BENCH_DIR / "baseline_proxy.py"),
             "--port", str(baseline_port), "--upstream", provider_url],
            logs=RESULTS_DIR,
        )  # fmt: skip
        baseline_url = f"http://127.0.0.1:{baseline_port}"

        policy_dir = tmp / "policies"
        policy_dir.mkdir()
        (policy_dir / "bench.yaml").write_text(
            POLICY_TEMPLATE.format(provider=PROVIDER, upstream=provider_url)
        )
        agent_token = "opg_bench_" + secrets.token_urlsafe(24)
        provider_secret = "sk_bench_" + secrets.token_hex(8)
        env = opgate_environment(
            db_url, policy_dir, tmp / "opgate-data", agent_port, ops_port, agent_token,
            provider_secret,
        )  # fmt: skip
        opgate = start_service(
            stack, "opgate", [config.python, "-m", "proxy", "serve"], env=env, logs=RESULTS_DIR
        )
        opgate_url = f"http://127.0.0.1:{agent_port}/bench"

        wait_ready(provider, provider_url + "/healthz")
        wait_ready(baseline, baseline_url + "/healthz")
        wait_ready(opgate, f"http://127.0.0.1:{ops_port}/readyz", timeout=60)
        # The lean gate uses the operations table opgate's migrations have just created.
        lean: Service | None = None
        if config.lean:
            lean = start_service(
                stack, "lean_gate",
                [config.python, str(BENCH_DIR / "lean_gate.py"), "--port", str(lean_port),
                 "--database-url", db_url, "--upstream", provider_url,
                 "--agent-token-sha256", sha256(agent_token), "--agent-id", AGENT_ID,
                 "--tenant", TENANT, "--provider", PROVIDER, "--route-prefix", "/bench"],
                env=os.environ | {"LEAN_GATE_CREDENTIAL": provider_secret},
                logs=RESULTS_DIR,
            )  # fmt: skip
            wait_ready(lean, f"http://127.0.0.1:{lean_port}/healthz")
        insert_operations(db_url, REJECT_OPERATION_ID, 1)
        # Now, while queries.sql is the one opgate has just loaded (the file may change under a
        # long run in a working tree; a stale statement then fails here, not in row 6).
        pgbench_file = pgbench_script(tmp, db_url)

        provider_pid = provider.process.pid
        targets = [
            WrkTarget("direct_get", "direct GET", "GET", provider_url + READ_PATH,
                      provider_pid=provider_pid),
            WrkTarget("direct_post", "direct POST", "POST", provider_url + "/v1/refunds",
                      REFUND_BODY, provider_pid=provider_pid),
            WrkTarget("baseline_get", "baseline GET", "GET", baseline_url + READ_PATH,
                      proxy_pid=baseline.process.pid, provider_pid=provider_pid),
            WrkTarget("baseline_post", "baseline POST", "POST", baseline_url + "/v1/refunds",
                      REFUND_BODY, proxy_pid=baseline.process.pid, provider_pid=provider_pid),
            WrkTarget("opgate_read", "opgate (a) read", "GET", opgate_url + READ_PATH,
                      token=agent_token, proxy_pid=opgate.process.pid, provider_pid=provider_pid),
        ]  # fmt: skip
        operation_target = WrkTarget(
            "opgate_operation", "opgate (b) operation", "POST", opgate_url + "/v1/refunds",
            REFUND_BODY, token=agent_token, proxy_pid=opgate.process.pid, provider_pid=provider_pid,
        )  # fmt: skip
        reject_target = WrkTarget(
            "opgate_reject", "opgate (c) rejection", "POST", opgate_url + "/v1/refunds",
            REJECT_BODY, token=agent_token, operation_id=str(REJECT_OPERATION_ID),
            expected_status=422, proxy_pid=opgate.process.pid, provider_pid=provider_pid,
        )  # fmt: skip
        lean_target: WrkTarget | None = None
        if lean is not None:
            lean_target = WrkTarget(
                "lean_operation", "lean gate (b)", "POST",
                f"http://127.0.0.1:{lean_port}/bench/v1/refunds", REFUND_BODY,
                token=agent_token, proxy_pid=lean.process.pid, provider_pid=provider_pid,
            )  # fmt: skip

        for target in targets:
            precheck(target)
            run_wrk(config, target, config.warmup)
            rows[target.key] = measure(config, target)
            print_progress(rows[target.key])

        # (b): size the approved operations from the baseline just measured (opgate cannot be
        # faster than the bare proxy in front of the same provider), with a wide margin.
        ceiling = max(rows["baseline_post"].rps, 500.0)
        row = measure_operations(config, db_url, operation_target, ceiling, "warmup", "measure")
        rows[row.key] = row
        print_progress(row)

        # The lean gate, right after (b): the same load, the same kind of fresh rows.
        if lean_target is not None:
            lean_row = measure_operations(
                config, db_url, lean_target, ceiling, "lean_warmup", "lean_measure"
            )
            chain = verify_lean_chain(db_url)
            lean_row.extra["audit_chain"] = chain
            lean_row.problems += chain_problems(chain, lean_row.statuses.get("200", 0))
            lean_row.valid = not lean_row.problems
            rows[lean_row.key] = lean_row
            print_progress(lean_row)

        body = precheck(reject_target)
        if "amount_mismatch" not in body:
            raise BenchError(f"opgate (c): the 422 is not amount_mismatch: {body[:300]}")
        run_wrk(config, reject_target, config.warmup)
        rows[reject_target.key] = measure(config, reject_target)
        print_progress(rows[reject_target.key])

        rows["pgbench"] = run_pgbench(config, db_url, tmp, pgbench_file)
        print_progress(rows["pgbench"])

        # The fixed-rate rows: open-loop load, latency from the scheduled time.
        fixed_targets = {
            "baseline": targets[3],
            "opgate": operation_target,
            "lean": lean_target,
        }
        block = 0
        for rate in config.fixed_rates:
            for name in config.fixed_targets:
                fixed_target = fixed_targets.get(name)
                if fixed_target is None:
                    continue
                fixed_row = measure_fixed_rate(
                    config, db_url, fixed_target, rate, block, fresh=name != "baseline"
                )
                block += 1
                rows[fixed_row.key] = fixed_row
                print_progress(fixed_row)

        if config.profile:
            for which in config.profile_rows:
                target = {"b": operation_target, "a": targets[4], "c": reject_target}[which]
                profile = profile_opgate(
                    config, target, db_url, opgate.process.pid, row.rps, RESULTS_DIR,
                    fresh_operations=which == "b",
                )  # fmt: skip
                profiles.append(profile)

        if opgate.process.poll() is not None:
            raise BenchError(f"opgate exited during the run:\n{opgate.stderr_tail()}")
        if lean is not None:
            if lean.process.poll() is not None:
                raise BenchError(f"the lean gate exited during the run:\n{lean.stderr_tail()}")
            stop_process(lean.process)
        opgate_stderr = opgate.stderr_tail()

        # The workers dimension: (b) again with 1, 2, N... worker processes, each a separately
        # started `opgate serve` (the single-process one above is stopped first, so only one
        # opgate runs at a time), on the same database, with the same pgbench row as the limit;
        # then the same with the opgate workers pinned to their own cores, and wrk, the
        # provider and the bench database's backends to the others.
        stop_process(opgate.process)
        ceiling = max(ceiling, rows["pgbench"].rps)
        layouts: list[tuple[int, CpuSplit | None]] = [(n, None) for n in config.workers_counts]
        split = cpu_split(config)
        if split is not None:
            layouts += [(n, split) for n in config.pinned_workers_counts]
        workers_config = replace(
            config, connections=config.workers_connections or config.connections
        )
        for index, (count, layout) in enumerate(layouts):
            workers_row = measure_workers(
                workers_config, stack, db_url, env, count, index, ceiling, agent_token,
                provider_pid, layout,
            )  # fmt: skip
            rows[workers_row.key] = workers_row
            print_progress(workers_row)

    result = report(config, rows, profiles, time.monotonic() - started, opgate_stderr)
    result["background_load_before"] = background
    return result


def opgate_environment(
    db_url: str,
    policy_dir: Path,
    data_dir: Path,
    agent_port: int,
    ops_port: int,
    agent_token: str,
    provider_secret: str,
) -> dict[str, str]:
    """opgate's whole configuration, from nothing but this run: every ``OPGATE_*`` of the
    caller's environment is dropped, so that an opgate configured in the same shell (or a
    ``./dev serve`` on the default ports) changes nothing here. Every listener is on a port of
    this run's own: the agent and ops listeners on free ports, the forward-proxy listener
    (default 127.0.0.1:3128) off, as no row measures forward mode. The data dir (the
    forward-proxy CA, dev credentials) is the run's temp dir, never the repository's .opgate."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
    return env | {
        "OPGATE_DATABASE_URL": db_url,
        "OPGATE_POLICY_DIR": str(policy_dir),
        "OPGATE_DATA_DIR": str(data_dir),
        "OPGATE_AGENT_LISTEN": f"127.0.0.1:{agent_port}",
        "OPGATE_OPS_LISTEN": f"127.0.0.1:{ops_port}",
        "OPGATE_FORWARD_LISTEN": "",  # empty: forward-proxy mode off (proxy/settings.py)
        "OPGATE_ADMIN_TOKEN_SHA256": sha256(secrets.token_urlsafe(24)),
        "OPGATE_AGENTS": json.dumps(
            [{"id": AGENT_ID, "tenant": TENANT, "token_sha256": sha256(agent_token)}]
        ),
        "OPGATE_SECRET_BENCH_KEY": provider_secret,
        # one process, like the baseline: the workers dimension is measured separately
        "OPGATE_WORKERS": "1",
        # every connection (wrk's, the open-loop generator's) is the one bench agent: the
        # per-agent cap on requests in flight must admit them all
        "OPGATE_MAX_REQUESTS_IN_FLIGHT_PER_AGENT": "100000",
    }


def measure_operations(
    config: Config,
    db_url: str,
    target: WrkTarget,
    ceiling: float,
    warm_key: str,
    measure_key: str,
    *,
    seconds: int | None = None,
) -> Row:
    """Row (b)'s shape, for opgate or the lean gate: fresh approved operations for a warm-up
    and the measurement (sized from ``ceiling`` req/s with a wide margin), a CHECKPOINT between
    them so that no row pays for another's dirty pages, and the database's count of confirmed
    rows checked against wrk's 200s."""
    seconds = seconds or config.duration
    warm_per = math.ceil(ceiling * config.warmup * 2 / config.threads) + 200
    measure_per = math.ceil(ceiling * seconds * 1.5 / config.threads) + 500
    warm_ids = id_range(warm_key, warm_per, config.threads)
    measure_ids = id_range(measure_key, measure_per, config.threads)
    insert_operations(db_url, warm_ids[0], warm_per * config.threads)
    insert_operations(db_url, measure_ids[0], measure_per * config.threads)
    precheck(target, operation_id=str(warm_ids[0] + warm_per - 1))
    run_wrk(config, target, config.warmup, warm_ids)
    psql(db_url, "CHECKPOINT")
    row = measure(replace(config, duration=seconds), target, measure_ids)
    counts = status_counts(db_url, measure_ids[0], measure_per * config.threads)
    row.extra["rows_by_status"] = counts
    if counts.get("confirmed", 0) < row.statuses.get("200", 0):
        row.valid = False
        row.problems.append(f"only {counts.get('confirmed', 0)} rows confirmed")
    return row


def verify_lean_chain(db_url: str) -> dict[str, int]:
    """Recomputes every link of the lean gate's audit chains: each record's hash from its
    predecessor's, its seq and its text; seqs without gaps; every head on its stream's last
    record. A constant or a broken chain makes the lean row invalid."""
    line = psql(
        db_url,
        """
        WITH c AS (
            SELECT stream, seq, prev_hash, hash, record,
                   lag(hash) OVER w AS prev, lag(seq) OVER w AS prev_seq
              FROM lean_audit WINDOW w AS (PARTITION BY stream ORDER BY seq))
        SELECT count(*), count(DISTINCT stream),
               count(*) FILTER (WHERE hash <> sha256(prev_hash || int8send(seq)
                                                     || convert_to(record, 'UTF8'))),
               count(*) FILTER (WHERE prev_hash <> coalesce(prev, decode(repeat('00', 32), 'hex'))),
               count(*) FILTER (WHERE seq <> coalesce(prev_seq, 0) + 1),
               (SELECT count(*) FROM lean_audit_heads h
                 WHERE h.seq > 0 AND NOT EXISTS (
                     SELECT FROM lean_audit a
                      WHERE a.stream = h.stream AND a.seq = h.seq AND a.hash = h.hash)),
               count(DISTINCT hash)
          FROM c
        """,
    )
    names = ("records", "streams", "bad_hashes", "bad_links", "seq_gaps", "stale_heads",
             "distinct_hashes")  # fmt: skip
    return dict(zip(names, (int(v) for v in line.split("|")), strict=True))


def chain_problems(chain: dict[str, int], answered: int) -> list[str]:
    problems = [
        f"audit chain: {chain[name]} {name.replace('_', ' ')}"
        for name in ("bad_hashes", "bad_links", "seq_gaps", "stale_heads")
        if chain[name]
    ]
    if chain["records"] < answered:
        problems.append(f"audit chain: {chain['records']} records for {answered} answers")
    if chain["distinct_hashes"] != chain["records"]:
        problems.append("audit chain: repeated hashes")
    return problems


def measure_fixed_rate(
    config: Config, db_url: str, target: WrkTarget, rate: float, block: int, *, fresh: bool
) -> Row:
    """One open-loop row (bench/open_loop.py): ``rate`` requests per second for
    ``fixed_duration`` seconds after a warm-up at the same rate, each request of an operation
    row its own fresh approved operation (``fresh``). With ``fixed_pin`` on two or more cores,
    the generator runs on the last core and the server under test is pinned to the others for
    the row (the provider and PostgreSQL stay where the scheduler puts them)."""
    total = round(rate * (config.warmup + config.fixed_duration))
    base: int | None = None
    if fresh:
        if total >= FIXED_RATE_BLOCK or block >= RANGE_SIZE // FIXED_RATE_BLOCK * 2:
            raise BenchError(f"{target.label} at {rate:g}/s: too many operations for its range")
        base = FIXED_RATE_RANGES_START + block * FIXED_RATE_BLOCK
        insert_operations(db_url, base, total)
        psql(db_url, "CHECKPOINT")
    cpus = usable_cpus()
    generator_cpus: tuple[int, ...] = ()
    server_cpus: tuple[int, ...] = ()
    realtime: list[str] = []
    if config.fixed_pin and len(cpus) >= 2:
        generator_cpus, server_cpus = cpus[-1:], cpus[:-1]
    if config.fixed_pin and os.geteuid() == 0 and shutil.which("chrt"):
        # SCHED_FIFO: its wake-ups are not delayed behind whatever else runs on its core (it
        # uses a few % of a core; the kernel's RT throttling bounds it anyway)
        realtime = ["chrt", "-f", "10"]
    headers = []
    if target.body:
        headers += ["--header", "Content-Type: application/x-www-form-urlencoded"]
    if target.token:
        headers += ["--header", f"Authorization: Bearer {target.token}"]
    argv = [
        *realtime,
        *taskset_prefix(generator_cpus),
        config.python, str(BENCH_DIR / "open_loop.py"),
        "--url", target.url, "--method", target.method, "--body", target.body,
        "--rate", f"{rate:g}", "--duration", str(config.fixed_duration),
        "--warmup", str(config.warmup), "--connections", "32", "--max-connections", "1024",
        "--timeout", "10", *headers,
        *(["--ids-base", str(base)] if base is not None else []),
    ]  # fmt: skip
    if server_cpus and target.proxy_pid:
        pin_process(target.proxy_pid, server_cpus)
    try:
        before = CpuSnapshot.take(target.proxy_pid, target.provider_pid)
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        after = CpuSnapshot.take(target.proxy_pid, target.provider_pid)
    finally:
        if server_cpus and target.proxy_pid:
            pin_process(target.proxy_pid, cpus)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("OPEN_LOOP_JSON ")), "")
    if result.returncode != 0 or not line:
        raise BenchError(
            f"open_loop failed for {target.label} at {rate:g}/s ({result.returncode}):\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    summary: dict[str, Any] = json.loads(line.removeprefix("OPEN_LOOP_JSON "))
    statuses = {str(k): int(v) for k, v in summary["statuses"].items()}
    errors = sum(int(v) for v in summary["errors"].values())
    problems: list[str] = []
    unexpected = {k: n for k, n in statuses.items() if int(k) != target.expected_status}
    if unexpected:
        problems.append(f"unexpected statuses {unexpected} (expected {target.expected_status})")
    if errors or summary["unanswered_after_timeout"]:
        problems.append(
            f"errors {summary['errors']}, {summary['unanswered_after_timeout']} unanswered"
        )
    latency = summary["latency_us"]
    row = Row(
        key=f"fixed_{target.key}_{rate:g}",
        label=f"{target.label} @{rate:g}/s",
        requests=int(summary["completed"]),
        rps=round(summary["completed"] / config.fixed_duration, 1),
        p50_ms=round(latency["p50"] / 1000, 3),
        p99_ms=round(latency["p99"] / 1000, 3),
        mean_ms=round(latency["mean"] / 1000, 3),
        statuses=statuses,
        socket_errors=errors + int(summary["unanswered_after_timeout"]),
        expected_status=target.expected_status,
        valid=not problems,
        problems=problems,
        # the window includes the warm-up's requests: per request of the whole window
        cpu_ms_per_request=cpu_use(before, after, total),
        extra={
            "fixed_rate": rate,
            "target": target.key,
            "p99_9_ms": round(latency["p99_9"] / 1000, 3),
            "max_ms": round(latency["max"] / 1000, 3),
            "service_time_ms": {
                k: round(v / 1000, 3) for k, v in summary["service_time_us"].items()
            },
            "late": summary["late"],
            "queued_for_connection": summary["queued_for_connection"],
            "max_in_flight": summary["max_in_flight"],
            "drain_ms": summary["drain_ms"],
            "connections": summary["connections"],
            "generator_cpu": summary["generator_cpu"],
            "generator_cpus": list(generator_cpus),
            "generator_realtime": bool(realtime),
            "server_cpus": list(server_cpus),
        },
    )
    if fresh and base is not None:
        counts = status_counts(db_url, base, total)
        row.extra["rows_by_status"] = counts
        if counts.get("confirmed", 0) < statuses.get("200", 0):
            row.valid = False
            row.problems.append(f"only {counts.get('confirmed', 0)} rows confirmed")
    return row


@dataclass(frozen=True)
class CpuSplit:
    """The pinned workers layout: opgate's supervisor and workers on ``workers``, wrk, the
    provider and the bench database's PostgreSQL backends on ``others``."""

    workers: tuple[int, ...]
    others: tuple[int, ...]


def cpu_split(config: Config) -> CpuSplit | None:
    """The layout of the pinned workers rows, or None (one core, or none asked for)."""
    cpus = usable_cpus()
    if not config.pinned_workers_counts or len(cpus) < 2:
        return None
    workers = config.workers_cpus or cpus[: len(cpus) // 2]
    others = tuple(c for c in cpus if c not in workers)
    if not others or not set(workers) <= set(cpus):
        raise BenchError(f"--workers-cpus {workers} leaves no usable core of {cpus} for the rest")
    return CpuSplit(tuple(workers), others)


def measure_workers(
    config: Config,
    stack: contextlib.ExitStack,
    db_url: str,
    env: dict[str, str],
    workers: int,
    index: int,
    ceiling: float,
    agent_token: str,
    provider_pid: int,
    split: CpuSplit | None = None,
) -> Row:
    """Row (b) against ``opgate serve`` with OPGATE_WORKERS=``workers`` (fresh listeners, the
    same database and provider), stopped again before returning. Its CPU column is the
    supervisor's and its workers' together. With ``split``, opgate is started under taskset on
    the workers' cores, wrk runs on the others, and the provider and the bench database's
    backends (opgate's pools, open after the warm-up) are moved to the others for the row."""
    agent_port, ops_port = free_port(), free_port()
    worker_env = env | {
        "OPGATE_AGENT_LISTEN": f"127.0.0.1:{agent_port}",
        "OPGATE_OPS_LISTEN": f"127.0.0.1:{ops_port}",
        "OPGATE_WORKERS": str(workers),
    }
    pinned = f"-pinned{''.join(map(str, split.workers))}" if split else ""
    service = start_service(
        stack, f"opgate-w{workers}{pinned}",
        [*taskset_prefix(split.workers if split else ()), config.python, "-m", "proxy", "serve"],
        env=worker_env, logs=RESULTS_DIR,
    )  # fmt: skip
    try:
        wait_ready(service, f"http://127.0.0.1:{ops_port}/readyz", timeout=60)
        label = f"opgate (b) {workers} worker{'s' * (workers > 1)}"
        if split:
            label += f" pinned {','.join(map(str, split.workers))}"
        if config.workers_connections:
            label += f" -c{config.connections}"
        target = WrkTarget(
            f"opgate_operation_w{workers}" + ("_pinned" if split else ""), label,
            "POST", f"http://127.0.0.1:{agent_port}/bench/v1/refunds", REFUND_BODY,
            token=agent_token, proxy_pid=service.process.pid, provider_pid=provider_pid,
            load_cpus=split.others if split else (),
        )  # fmt: skip
        seconds = config.workers_duration
        warm_per = math.ceil(ceiling * config.warmup * 2 / config.threads) + 200
        measure_per = math.ceil(ceiling * seconds * 1.5 / config.threads) + 500
        base = WORKERS_RANGES_START + index * RANGE_SIZE
        if (warm_per + measure_per) * config.threads >= RANGE_SIZE:
            raise BenchError(f"{target.label}: too many operations for the id range")
        warm_ids = (base, warm_per)
        measure_ids = (base + warm_per * config.threads, measure_per)
        insert_operations(db_url, base, (warm_per + measure_per) * config.threads)
        precheck(target, operation_id=str(base + warm_per - 1))
        run_wrk(config, target, config.warmup, warm_ids)
        psql(db_url, "CHECKPOINT")  # as before row (b): no row pays for another's dirty pages
        pinned_backends = 0
        if split:
            pin_process(provider_pid, split.others)
            backends = bench_backends(db_url)
            pinned_backends = sum(1 for pid in backends if pin_process(pid, split.others))
        try:
            row = measure(replace(config, duration=seconds), target, measure_ids)
        finally:
            if split:
                pin_process(provider_pid, usable_cpus())
        counts = status_counts(db_url, measure_ids[0], measure_per * config.threads)
        row.extra |= {
            "workers": workers,
            "rows_by_status": counts,
            "connections": config.connections,
        }
        if split:
            row.extra["pinned"] = {
                "opgate_cpus": list(split.workers),
                "wrk_provider_postgres_cpus": list(split.others),
                "bench_backends_pinned": pinned_backends,
            }
        if counts.get("confirmed", 0) < row.statuses.get("200", 0):
            row.valid = False
            row.problems.append(f"only {counts.get('confirmed', 0)} rows confirmed")
        if service.process.poll() is not None:
            raise BenchError(f"{service.name} exited during the run:\n{service.stderr_tail()}")
        return row
    finally:
        stop_process(service.process)


def background_load(seconds: float = 1.0) -> dict[str, Any]:
    """How busy the machine is before we add anything: on a shared 2-core machine another
    process (a test suite, a build) takes CPU from every row, so the run records it."""
    before_machine, before_procs = machine_cpu_seconds(), all_processes_cpu_seconds()
    time.sleep(seconds)
    after_machine, after_procs = machine_cpu_seconds(), all_processes_cpu_seconds()
    wall = after_machine.total - before_machine.total
    busy = after_machine.busy - before_machine.busy
    spent = sorted(
        (
            (cpu - before_procs.get(pid, (comm, 0.0))[1], comm)
            for pid, (comm, cpu) in after_procs.items()
        ),
        reverse=True,
    )
    return {
        "busy_percent": round(100 * busy / wall, 1) if wall > 0 else 0.0,
        "top": [f"{comm} {round(100 * cpu / seconds)}%" for cpu, comm in spent[:3] if cpu > 0],
    }


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def print_progress(row: Row) -> None:
    state = "ok" if row.valid else "INVALID: " + "; ".join(row.problems)
    print(
        f"  {row.label:<24} {row.rps:>9.1f} req/s  p50 {row.p50_ms:.2f} ms  "
        f"p99 {row.p99_ms:.2f} ms  {state}",
        file=sys.stderr,
        flush=True,
    )


def report(
    config: Config,
    rows: dict[str, Row],
    profiles: list[dict[str, Any]],
    elapsed: float,
    opgate_stderr: str,
) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float | None:
        if a not in rows or b not in rows or not rows[b].rps:
            return None
        return round(rows[a].rps / rows[b].rps, 3)

    def added(a: str, b: str) -> dict[str, float]:
        return {
            "p50_ms": round(rows[a].p50_ms - rows[b].p50_ms, 3),
            "p99_ms": round(rows[a].p99_ms - rows[b].p99_ms, 3),
        }

    def cpu(key: str, column: str) -> float | None:
        use = rows[key].cpu_ms_per_request if key in rows else None
        value = getattr(use, column) if use is not None else None
        return float(value) if value is not None else None

    def cpu_ratio(a: str, b: str, column: str) -> float | None:
        x, y = cpu(a, column), cpu(b, column)
        return round(x / y, 3) if x is not None and y else None

    operation_share = ratio("opgate_operation", "baseline_post") or 0.0
    workers = {}
    for row in rows.values():
        if "workers" not in row.extra:
            continue
        pinned = "pinned" in row.extra
        one = "opgate_operation_w1_pinned" if pinned else "opgate_operation_w1"
        workers[f"{row.extra['workers']}{' pinned' if pinned else ''}"] = {
            "rps": row.rps,
            "vs_baseline_post": ratio(row.key, "baseline_post"),
            "vs_pgbench": ratio(row.key, "pgbench"),
            "vs_one_worker": ratio(row.key, one) if one in rows else None,
        }
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": {
            "cores": os.cpu_count(),
            "usable_cores": len(usable_cpus()),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loopback_only": True,
        },
        "config": asdict(config),
        "elapsed_seconds": round(elapsed, 1),
        "valid": all(r.valid for r in rows.values()),
        "rows": [asdict(r) for r in rows.values()],
        "ratios": {
            "baseline_vs_direct": {
                "get": ratio("baseline_get", "direct_get"),
                "post": ratio("baseline_post", "direct_post"),
            },
            "opgate_vs_baseline": {
                "a_read": ratio("opgate_read", "baseline_get"),
                "b_operation": operation_share,
                "c_rejection": ratio("opgate_reject", "baseline_post"),
            },
            "added_latency_vs_baseline": {
                "a_read": added("opgate_read", "baseline_get"),
                "b_operation": added("opgate_operation", "baseline_post"),
                "c_rejection": added("opgate_reject", "baseline_post"),
            },
            "b_operation_vs_pgbench": ratio("opgate_operation", "pgbench"),
            "b_operation_vs_lean_gate": {
                "rps": ratio("opgate_operation", "lean_operation"),
                "machine_cpu": cpu_ratio("opgate_operation", "lean_operation", "machine"),
                "own_cpu": cpu_ratio("opgate_operation", "lean_operation", "ours"),
                "proxy_cpu": cpu_ratio("opgate_operation", "lean_operation", "proxy"),
                "postgres_cpu": cpu_ratio("opgate_operation", "lean_operation", "postgres"),
            }
            if "lean_operation" in rows
            else None,
            "lean_gate_vs_baseline_post": ratio("lean_operation", "baseline_post"),
            "fixed_rate": fixed_rate_ratios(rows),
            "workers": workers,
            "workers_cpu_budget": workers_cpu_budget(rows),
        },
        "targets": targets(ratio, cpu_ratio, fixed_rate_ratios(rows), workers),
        "profiles": profiles,
        "opgate_stderr_tail": opgate_stderr,
    }


def targets(
    ratio: Callable[[str, str], float | None],
    cpu_ratio: Callable[[str, str, str], float | None],
    fixed_rate: dict[str, Any],
    workers: dict[str, Any],
) -> list[dict[str, Any]]:
    """The performance targets opgate is held to, each judged on this run's own rows."""
    at_200 = fixed_rate.get("200", {}).get("opgate_operation_minus_baseline") or {}
    pinned_two = workers.get("2 pinned", {}).get("vs_one_worker")
    goals: list[tuple[str, float | None, str, float]] = [
        (
            "(b) machine CPU / lean gate's <= 1.3",
            cpu_ratio("opgate_operation", "lean_operation", "machine"),
            "<=",
            1.3,
        ),
        (
            "(b) req/s / baseline POST's >= 0.30",
            ratio("opgate_operation", "baseline_post"),
            ">=",
            0.30,
        ),
        (
            "(a) machine CPU / baseline GET's <= 1.6",
            cpu_ratio("opgate_read", "baseline_get", "machine"),
            "<=",
            1.6,
        ),
        ("(a) req/s / baseline GET's >= 0.6", ratio("opgate_read", "baseline_get"), ">=", 0.6),
        ("(c) req/s / baseline POST's >= 0.6", ratio("opgate_reject", "baseline_post"), ">=", 0.6),
        ("200/s: (b) p50 minus baseline POST's <= 2 ms", at_200.get("p50_ms"), "<=", 2.0),
        ("200/s: (b) p99 minus baseline POST's <= 6 ms", at_200.get("p99_ms"), "<=", 6.0),
        ("(b) 2 pinned workers / 1 pinned worker >= 1.3", pinned_two, ">=", 1.3),
    ]
    judged = []
    for goal, value, sense, bound in goals:
        met = None if value is None else (value <= bound if sense == "<=" else value >= bound)
        judged.append({"goal": goal, "value": value, "bound": bound, "met": met})
    return judged


def fixed_rate_ratios(rows: dict[str, Row]) -> dict[str, Any]:
    """Per rate: each target's latency percentiles from the scheduled time, and opgate's and
    the lean gate's added latency over the baseline at the same rate."""
    by_rate: dict[str, dict[str, Any]] = {}
    for row in rows.values():
        if "fixed_rate" not in row.extra:
            continue
        entry = by_rate.setdefault(f"{row.extra['fixed_rate']:g}", {})
        entry[row.extra["target"]] = {
            "p50_ms": row.p50_ms,
            "p99_ms": row.p99_ms,
            "p99_9_ms": row.extra["p99_9_ms"],
            "achieved_rps": row.rps,
            "late": row.extra["late"]["count"],
            "max_in_flight": row.extra["max_in_flight"],
            "drain_ms": row.extra["drain_ms"],
            "generator_cpu_percent": row.extra["generator_cpu"]["percent_of_one_core"],
        }
    for entry in by_rate.values():
        base = entry.get("baseline_post")
        for name in ("opgate_operation", "lean_operation"):
            if base and name in entry:
                entry[f"{name}_minus_baseline"] = {
                    p: round(entry[name][p] - base[p], 3) for p in ("p50_ms", "p99_ms", "p99_9_ms")
                }
    return by_rate


def workers_cpu_budget(rows: dict[str, Row]) -> dict[str, Any] | None:
    """What the machine's CPU allows the workers dimension, from the one-worker row's own
    per-request cost: at that cost, every layout of any number of workers is bounded by
    cores x 1000 ms/s divided by this run's CPU per request (opgate, PostgreSQL, provider, wrk
    and the kernel's interrupts; not other users' processes). A 1.3x target needs that bound
    >= 1.3x the one-worker row."""
    row = rows.get("opgate_operation_w1")
    use = row.cpu_ms_per_request if row else None
    if row is None or use is None or not use.ours or not row.rps:
        return None
    cores = len(usable_cpus())
    limit = cores * 1000.0 / use.ours
    budget: dict[str, Any] = {
        "cores": cores,
        "own_ms_per_request": use.ours,
        "machine_ms_per_request": use.machine,
        "one_worker_rps": row.rps,
        "one_worker_busy_percent": use.machine_busy_percent,
        "machine_limit_rps": round(limit, 1),
        "max_speedup_over_one_worker": round(limit / row.rps, 3),
        "ms_per_s_needed_for_1_3x": round(1.3 * row.rps * use.ours, 1),
        "ms_per_s_available": cores * 1000,
    }
    pinned = rows.get("opgate_operation_w1_pinned")
    pinned_use = pinned.cpu_ms_per_request if pinned else None
    if pinned is not None and pinned_use is not None and pinned_use.proxy:
        layout = pinned.extra["pinned"]
        rest = pinned_use.ours - pinned_use.proxy
        budget["pinned_layout"] = {
            "opgate_cpus": layout["opgate_cpus"],
            "others_cpus": layout["wrk_provider_postgres_cpus"],
            "opgate_ms_per_request": pinned_use.proxy,
            "others_ms_per_request": round(rest, 4),
            # each side's bound at the one-worker row's costs, whatever the number of workers
            "opgate_side_limit_rps": round(len(layout["opgate_cpus"]) * 1000 / pinned_use.proxy),
            "others_side_limit_rps": round(len(layout["wrk_provider_postgres_cpus"]) * 1000 / rest)
            if rest > 0
            else None,
        }
    return budget


def git_commit() -> str | None:
    result = subprocess.run(
        ["git", "-C", str(REPO), "describe", "--always", "--dirty", "--abbrev=12"],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() or None


def print_table(result: dict[str, Any]) -> None:
    header = (
        f"{'row':<34} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}  "
        f"{'CPU ms/req: proxy':>17} {'prov':>5} {'pg':>5} {'load':>5} {'irq':>5} {'steal':>5} "
        f"{'ours':>5} {'all':>5} {'busy':>5}"
    )
    print(header)
    print("-" * len(header))
    for row in result["rows"]:
        cpu = row["cpu_ms_per_request"] or {}
        errors = row["socket_errors"] + sum(
            n for s, n in row["statuses"].items() if int(s) != row["expected_status"]
        )

        def show(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        print(
            f"{row['label']:<34} {row['rps']:>9.1f} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f} {errors:>7}  {show(cpu.get('proxy')):>17} "
            f"{show(cpu.get('provider')):>5} {show(cpu.get('postgres')):>5} "
            f"{show(cpu.get('load_generator')):>5} {show(cpu.get('interrupts')):>5} "
            f"{show(cpu.get('steal')):>5} {show(cpu.get('ours')):>5} {show(cpu.get('machine')):>5} "
            f"{cpu.get('machine_busy_percent', 0):>4.0f}%"
        )
    for row in result["rows"]:
        others = (row["cpu_ms_per_request"] or {}).get("other_processes") or {}
        if others:
            shown = ", ".join(f"{name} {ms:.2f}" for name, ms in others.items())
            print(f"  other processes during {row['label']} (ms/req): {shown}")
    for row in result["rows"]:
        share = (row["cpu_ms_per_request"] or {}).get("proxy_kernel_share")
        if share is not None:
            print(f"  {row['label']}: {100 * share:.0f}% of the proxy's CPU is in the kernel")
    ratios = result["ratios"]

    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}x"

    print()
    print(
        f"baseline / direct:        GET {x(ratios['baseline_vs_direct']['get'])}   "
        f"POST {x(ratios['baseline_vs_direct']['post'])}"
    )
    for key, label in (
        ("a_read", "(a) read  vs baseline GET "),
        ("b_operation", "(b) op    vs baseline POST"),
        ("c_rejection", "(c) reject vs baseline POST"),
    ):
        lat = ratios["added_latency_vs_baseline"][key]
        print(
            f"opgate {label}: {x(ratios['opgate_vs_baseline'][key])} throughput, "
            f"+{lat['p50_ms']:.2f} ms p50, +{lat['p99_ms']:.2f} ms p99"
        )
    print(f"opgate (b) / pgbench claim+settle: {x(ratios['b_operation_vs_pgbench'])}")
    lean = ratios["b_operation_vs_lean_gate"]
    if lean:
        print(
            f"opgate (b) / lean gate (b): machine CPU per request {x(lean['machine_cpu'])} "
            f"(this run's own {x(lean['own_cpu'])}: proxy {x(lean['proxy_cpu'])}, "
            f"PostgreSQL {x(lean['postgres_cpu'])}), "
            f"throughput {x(lean['rps'])}; lean gate / baseline POST "
            f"{x(ratios['lean_gate_vs_baseline_post'])}"
        )
    for workers, figures in ratios["workers"].items():
        scaling = figures["vs_one_worker"]
        print(
            f"opgate (b) with {workers} worker(s): {figures['rps']:.0f} req/s = "
            f"{x(figures['vs_baseline_post'])} baseline POST, "
            f"{x(figures['vs_pgbench'])} pgbench"
            + (f", {scaling:.2f}x one worker" if scaling is not None else "")
        )
    budget = ratios["workers_cpu_budget"]
    if budget:
        print(
            f"CPU budget: one worker's row costs {budget['own_ms_per_request']:.2f} ms of CPU per "
            f"request (opgate, pg, provider, wrk, irq), so {budget['cores']} cores allow at most "
            f"{budget['machine_limit_rps']:.0f} req/s in any layout = "
            f"{budget['max_speedup_over_one_worker']:.2f}x the one-worker row "
            f"({budget['one_worker_busy_percent']:.0f}% busy)"
        )
        layout = budget.get("pinned_layout")
        if layout:
            print(
                f"  pinned: opgate on {layout['opgate_cpus']} at "
                f"{layout['opgate_ms_per_request']:.2f} ms/req allows "
                f"{layout['opgate_side_limit_rps']} req/s; the rest on {layout['others_cpus']} "
                f"at {layout['others_ms_per_request']:.2f} ms/req allows "
                f"{layout['others_side_limit_rps']} req/s"
            )
    fixed = ratios["fixed_rate"]
    if fixed:
        print("\nfixed rate (open loop, latency from the scheduled time):")
        print(
            f"  {'rate':>6} {'row':<22} {'p50 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} "
            f"{'late':>5} {'in flight':>9} {'drain ms':>9} {'gen CPU':>8}"
        )
        for rate, entry in fixed.items():
            for name, label in (
                ("baseline_post", "baseline POST"),
                ("opgate_operation", "opgate (b)"),
                ("lean_operation", "lean gate (b)"),
            ):
                if name not in entry:
                    continue
                f = entry[name]
                print(
                    f"  {rate:>6} {label:<22} {f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f} "
                    f"{f['p99_9_ms']:>9.2f} {f['late']:>5} {f['max_in_flight']:>9} "
                    f"{f['drain_ms']:>9.0f} {f['generator_cpu_percent']:>7.1f}%"
                )
            for name, label in (("opgate_operation", "opgate (b)"), ("lean_operation", "lean")):
                delta = entry.get(f"{name}_minus_baseline")
                if delta:
                    print(
                        f"  {rate:>6} {label + ' - baseline':<22} {delta['p50_ms']:>+8.2f} "
                        f"{delta['p99_ms']:>+8.2f} {delta['p99_9_ms']:>+9.2f}"
                    )
    print("\ntargets (each a ratio or a difference within this run):")
    for target in result["targets"]:
        value = target["value"]
        shown = "n/a (row not run)" if value is None else f"{value:.2f}"
        verdict = "" if target["met"] is None else ("MET" if target["met"] else "NOT MET")
        print(f"  {target['goal']:<58} {shown:>8}  {verdict}")
    for profile in result.get("profiles") or []:
        if "self" not in profile:
            print(f"\nprofile: {profile.get('skipped')}")
            continue
        print(
            f"\npy-spy --gil on opgate during {profile['row']} ({profile['samples']} samples, "
            f"{profile['rps_while_profiled']} req/s while sampled); top self time:"
        )
        for entry in profile["self"][:12]:
            print(f"  {entry['percent']:5.1f}%  {entry['name']}")
        print("inclusive, opgate's own functions:")
        own = [e for e in profile["inclusive"] if "(proxy/" in e["name"]]
        for entry in own[:12]:
            print(f"  {entry['percent']:5.1f}%  {entry['name']}")
        print("by package (self):")
        for entry in profile["self_by_package"][:8]:
            print(f"  {entry['percent']:5.1f}%  {entry['name']}")
    if not result["valid"]:
        print("\nINVALID RUN: see the rows' problems in bench/results/latest.json")


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description="opgate throughput benchmark (see README.md)")
    parser.add_argument("--duration", type=int, default=10, help="seconds per measured row")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--threads", type=int, default=2, help="wrk threads (default: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="seconds of warm-up per row")
    parser.add_argument(
        "--pgbench-clients",
        type=int,
        default=10,
        help="pgbench clients (default 10: opgate's pool size)",
    )
    parser.add_argument(
        "--admin-url",
        default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a superuser URL; the bench creates and drops its own database",
    )
    parser.add_argument(
        "--python",
        default=default_python(),
        help="the interpreter with opgate installed (default: the repository's .venv, else "
        "/work/venv, else this one)",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="b",
        default=None,
        help="also sample opgate with py-spy --gil during an extra run of rows: b (the "
        "operation, the default), a (the read), c (the rejection), or several: b,a",
    )
    parser.add_argument("--profile-seconds", type=int, default=8)
    parser.add_argument("--keep-database", action="store_true")
    parser.add_argument(
        "--workers-counts",
        default=",".join(str(n) for n in default_workers_counts()),
        help="opgate worker processes for the workers dimension of (b), comma-separated "
        "(default: 1, 2, the usable cores N and, up to 4 cores, 2N to show oversubscription; "
        "'none' skips it)",
    )
    parser.add_argument(
        "--workers-duration", type=int, default=5, help="seconds per workers-dimension row"
    )
    parser.add_argument(
        "--pinned-workers-counts",
        default="1,2",
        help="workers rows run again pinned: opgate on --workers-cpus, wrk, the provider and "
        "the bench database's backends on the other cores ('none' skips them)",
    )
    parser.add_argument(
        "--workers-cpus",
        default="",
        help="the cores of the opgate workers in the pinned rows, e.g. 0 or 0-1 (default: the "
        "first half of the usable cores)",
    )
    parser.add_argument(
        "--workers-connections",
        type=int,
        default=0,
        help="wrk connections of the workers rows (default: --connections). At 16, a single "
        "worker's row is bound by 16 / its latency, which a second worker does not shorten",
    )
    parser.add_argument("--no-lean", action="store_true", help="skip the lean gate rows")
    parser.add_argument(
        "--fixed-rates",
        default="200,500",
        help="open-loop rates in requests/s, comma-separated ('none' skips them)",
    )
    parser.add_argument(
        "--fixed-targets",
        default="baseline,opgate,lean",
        help="which servers the fixed-rate rows load: baseline, opgate, lean",
    )
    parser.add_argument(
        "--fixed-duration", type=int, default=8, help="measured seconds per fixed-rate row"
    )
    parser.add_argument(
        "--no-fixed-pin",
        action="store_true",
        help="do not pin the open-loop generator to the last core and the server off it",
    )
    args = parser.parse_args(argv)
    profile_rows: tuple[str, ...] = ()
    if args.profile:
        profile_rows = tuple(r.strip() for r in args.profile.split(",") if r.strip())
        if not set(profile_rows) <= {"a", "b", "c"}:
            parser.error("--profile takes rows among b, a and c, e.g. b or b,a")
    fixed_targets = tuple(t.strip() for t in args.fixed_targets.split(",") if t.strip())
    if not set(fixed_targets) <= {"baseline", "opgate", "lean"}:
        parser.error("--fixed-targets takes baseline, opgate, lean")
    return Config(
        duration=args.duration,
        connections=args.connections,
        threads=args.threads,
        warmup=args.warmup,
        pgbench_clients=args.pgbench_clients,
        admin_url=args.admin_url,
        python=args.python,
        profile=bool(profile_rows),
        profile_seconds=args.profile_seconds,
        keep_database=args.keep_database,
        workers_counts=counts_list(args.workers_counts),
        workers_duration=args.workers_duration,
        profile_rows=profile_rows,
        lean=not args.no_lean,
        fixed_rates=tuple(float(r) for r in counts_list(args.fixed_rates)),
        fixed_targets=fixed_targets,
        fixed_duration=args.fixed_duration,
        fixed_pin=not args.no_fixed_pin,
        pinned_workers_counts=counts_list(args.pinned_workers_counts),
        workers_cpus=cpu_list(args.workers_cpus),
        workers_connections=args.workers_connections,
    )


def counts_list(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4), sorted and unique; ``none`` -> ()."""
    if text.strip() == "none":
        return ()
    return tuple(sorted({int(n) for n in text.split(",") if n.strip()}))


def cpu_list(text: str) -> tuple[int, ...]:
    """taskset's list syntax: ``0``, ``0,2``, ``0-1``."""
    cpus: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cpus))


def default_python() -> str:
    for candidate in PYTHON_CANDIDATES:
        if candidate.exists():
            return str(candidate)
    return sys.executable


def default_workers_counts() -> list[int]:
    cores = len(os.sched_getaffinity(0)) or 1
    counts = {1, 2, cores}
    if cores <= 4:
        counts.add(2 * cores)
    return sorted(counts)


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the ExitStack stops every server and drops the database.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(
        f"opgate bench: {config.duration}s per row, wrk -t{config.threads} "
        f"-c{config.connections}, {os.cpu_count()} cores",
        file=sys.stderr,
    )
    try:
        result = run(config)
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    print()
    print_table(result)
    print(
        f"\nwritten: {(RESULTS_DIR / 'latest.json').relative_to(REPO)} "
        f"({result['elapsed_seconds']} s)"
    )
    return 0 if result["valid"] else 2


if __name__ == "__main__":
    sys.exit(main())
