"""opgate's throughput benchmark: every row measured side by side, in one run, on one machine.

    python bench/run.py [--duration 10] [--connections 16] [--profile] [--workers-counts 1,2,4]

Rows (all on loopback, the same wrk script and settings for every HTTP row):

- direct GET/POST: wrk straight to the fake provider (bench/provider.py): the upstream's limit.
- baseline GET/POST: through a bare aiohttp forwarding proxy (bench/baseline_proxy.py): what any
  Python proxy costs here, the reference opgate is judged against.
- opgate (a) read: GET through opgate on a rule with ``operation: none`` (no database).
- opgate (b) operation: POST /v1/refunds, every request a distinct pre-approved operation, end to
  end (load the row, checks, claim, forward, settle, audit line).
- opgate (c) rejection: a wrong amount against an existing operation (422 amount_mismatch).
- pgbench claim+settle: the two transition statements opgate runs for (b), taken verbatim from
  proxy/store/queries.sql, on fresh rows: the database's own limit.
- the workers dimension: (b) again against `opgate serve` with OPGATE_WORKERS=1, 2, N... (one
  at a time, each started and stopped separately), as ratios to baseline POST and to pgbench.

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
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
LUA_SCRIPT = BENCH_DIR / "wrk" / "bench.lua"
DEFAULT_PYTHON = Path("/work/venv/bin/python")

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
RANGES = {"warmup": 10_000_000, "measure": 20_000_000, "profile": 30_000_000, "pgbench": 40_000_000}
WORKERS_RANGES_START = 50_000_000  # then one RANGE_SIZE per workers count
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
) -> Service:
    """Starts a server whose stdout goes to /dev/null (opgate's audit line: one JSON line per
    request, rendered and written all the same, so its cost is measured) and whose stderr goes to
    a file, and registers its stop on ``stack`` so that it is stopped on every exit path."""
    stderr_path = logs / f"{name}.stderr.log"
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            list(argv), stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=REPO
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
def bench_database(admin_url: str, keep: bool) -> Iterator[str]:
    """A fresh database for this run, dropped afterwards (FORCE: opgate may still be connected
    if it failed to stop)."""
    name = f"opgate_bench_{os.getpid()}"
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
    psql(db_url, "VACUUM ANALYZE operation_events")


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
            kind = re.split(r"[/:]", comm)[0]  # kworker/1:2H-kblockd -> kworker
            others[kind] = others.get(kind, 0.0) + spent
    machine = after.machine.busy - before.machine.busy
    wall = after.machine.total - before.machine.total
    kernel_share = None
    proxy_ms = delta(before.proxy, after.proxy)
    kernel_ms = delta(before.proxy_system, after.proxy_system)
    if proxy_ms and kernel_ms is not None:
        kernel_share = round(kernel_ms / proxy_ms, 3)
    return CpuUse(
        proxy=proxy_ms,
        proxy_kernel_share=kernel_share,
        provider=delta(before.provider, after.provider),
        postgres=round(postgres * per, 4),
        # wrk is the only child reaped while a row runs, so the children's rusage delta is wrk
        load_generator=round((after.children - before.children) * per, 4),
        other_processes={
            name: round(cpu * per, 4)
            for name, cpu in sorted(others.items(), key=lambda item: -item[1])[:4]
            if cpu * per >= 0.005
        },
        interrupts=round((after.machine.interrupts - before.machine.interrupts) * per, 4),
        steal=round((after.machine.steal - before.machine.steal) * per, 4),
        machine=round(machine * per, 4),
        machine_busy_percent=round(100.0 * machine / wall, 1) if wall > 0 else 0.0,
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
    *occurrence* of a variable into its own parameter, so a repeated one (``$2`` in the event's
    ``jsonb_build_object``) would otherwise have no type at all."""
    sys.path.insert(0, str(REPO))
    from proxy.store.queries import load_queries  # stdlib-only module: the SQL opgate runs

    queries = load_queries()

    def with_variables(name: str, prefix: str) -> str:
        sql = queries[name]
        types = psql(
            db_url,
            f"PREPARE bench_probe AS {sql}; SELECT unnest(parameter_types)::text "
            f"FROM pg_prepared_statements WHERE name = 'bench_probe'",
        ).splitlines()

        def variable(match: re.Match[str]) -> str:
            number = int(match.group(1))
            name = "opid" if number == 1 else f"{prefix}_p{number}"
            return f":{name}::{types[number - 1]}"

        return re.sub(r"\$(\d+)", variable, sql)

    claim = with_variables("claim_operation", "claim")
    settle = with_variables("settle_operation", "settle")
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
        "claim_p2": owner, "claim_p3": "35", "claim_p4": "false", "claim_p5": owner,
        "settle_p2": "confirmed", "settle_p3": "200", "settle_p4": "re_bench_1",
        "settle_p5": "application/json", "settle_p6": answer, "settle_p7": owner,
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
    config: Config, target: WrkTarget, db_url: str, opgate_pid: int, rps: float, logs: Path
) -> dict[str, Any]:
    """Samples opgate with py-spy (non-blocking, so it barely slows the target) while wrk runs
    row (b) again on fresh operations; returns the top self and inclusive costs."""
    py_spy = shutil.which("py-spy") or str(Path(config.python).parent / "py-spy")
    if not Path(py_spy).exists():
        return {"skipped": f"py-spy not found; install it: {config.python} -m pip install py-spy"}
    seconds = config.profile_seconds
    per_thread = math.ceil(max(rps, 500) * seconds * 2 / config.threads) + 500
    ids = id_range("profile", per_thread, config.threads)
    insert_operations(db_url, ids[0], per_thread * config.threads)
    raw = logs / "opgate-profile.txt"
    spy = subprocess.Popen(
        [py_spy, "record", "--pid", str(opgate_pid), "--duration", str(seconds + 1),
         "--rate", "200", "--nonblocking", "--format", "raw", "--output", str(raw)],
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
    for tool in ("wrk", "pgbench", "psql"):
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
    profile: dict[str, Any] | None = None
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opgate-bench-")))
        db_url = stack.enter_context(bench_database(config.admin_url, config.keep_database))

        provider_port, baseline_port, agent_port, ops_port = (free_port() for _ in range(4))
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
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
        env |= {
            "OPGATE_DATABASE_URL": db_url,
            "OPGATE_POLICY_DIR": str(policy_dir),
            "OPGATE_AGENT_LISTEN": f"127.0.0.1:{agent_port}",
            "OPGATE_OPS_LISTEN": f"127.0.0.1:{ops_port}",
            "OPGATE_ADMIN_TOKEN_SHA256": sha256(secrets.token_urlsafe(24)),
            "OPGATE_AGENTS": json.dumps(
                [{"id": AGENT_ID, "tenant": TENANT, "token_sha256": sha256(agent_token)}]
            ),
            "OPGATE_SECRET_BENCH_KEY": "sk_bench_" + secrets.token_hex(8),
            # one process, like the baseline: the workers dimension is measured separately
            "OPGATE_WORKERS": "1",
            # every wrk connection is the one bench agent: the per-agent cap must admit them all
            "OPGATE_MAX_REQUESTS_IN_FLIGHT_PER_AGENT": str(max(64, config.connections)),
        }
        opgate = start_service(
            stack, "opgate", [config.python, "-m", "proxy", "serve"], env=env, logs=RESULTS_DIR
        )
        opgate_url = f"http://127.0.0.1:{agent_port}/bench"

        wait_ready(provider, provider_url + "/healthz")
        wait_ready(baseline, baseline_url + "/healthz")
        wait_ready(opgate, f"http://127.0.0.1:{ops_port}/readyz", timeout=60)
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

        for target in targets:
            precheck(target)
            run_wrk(config, target, config.warmup)
            rows[target.key] = measure(config, target)
            print_progress(rows[target.key])

        # (b): size the approved operations from the baseline just measured (opgate cannot be
        # faster than the bare proxy in front of the same provider), with a wide margin.
        ceiling = max(rows["baseline_post"].rps, 500.0)
        warm_per = math.ceil(ceiling * config.warmup * 2 / config.threads) + 200
        measure_per = math.ceil(ceiling * config.duration * 1.5 / config.threads) + 500
        warm_ids = id_range("warmup", warm_per, config.threads)
        measure_ids = id_range("measure", measure_per, config.threads)
        insert_operations(db_url, warm_ids[0], warm_per * config.threads)
        insert_operations(db_url, measure_ids[0], measure_per * config.threads)
        precheck(operation_target, operation_id=str(warm_ids[0] + warm_per - 1))
        run_wrk(config, operation_target, config.warmup, warm_ids)
        psql(db_url, "CHECKPOINT")
        row = measure(config, operation_target, measure_ids)
        counts = status_counts(db_url, measure_ids[0], measure_per * config.threads)
        row.extra["rows_by_status"] = counts
        if counts.get("confirmed", 0) < row.statuses.get("200", 0):
            row.valid = False
            row.problems.append(f"only {counts.get('confirmed', 0)} rows confirmed")
        rows[row.key] = row
        print_progress(row)

        body = precheck(reject_target)
        if "amount_mismatch" not in body:
            raise BenchError(f"opgate (c): the 422 is not amount_mismatch: {body[:300]}")
        run_wrk(config, reject_target, config.warmup)
        rows[reject_target.key] = measure(config, reject_target)
        print_progress(rows[reject_target.key])

        rows["pgbench"] = run_pgbench(config, db_url, tmp, pgbench_file)
        print_progress(rows["pgbench"])

        if config.profile:
            profile = profile_opgate(
                config, operation_target, db_url, opgate.process.pid, row.rps, RESULTS_DIR
            )

        if opgate.process.poll() is not None:
            raise BenchError(f"opgate exited during the run:\n{opgate.stderr_tail()}")
        opgate_stderr = opgate.stderr_tail()

        # The workers dimension: (b) again with 1, 2, N... worker processes, each a separately
        # started `opgate serve` (the single-process one above is stopped first, so only one
        # opgate runs at a time), on the same database, with the same pgbench row as the limit.
        stop_process(opgate.process)
        ceiling = max(ceiling, rows["pgbench"].rps)
        for index, count in enumerate(config.workers_counts):
            workers_row = measure_workers(
                config, stack, db_url, env, count, index, ceiling, agent_token, provider_pid
            )
            rows[workers_row.key] = workers_row
            print_progress(workers_row)

    result = report(config, rows, profile, time.monotonic() - started, opgate_stderr)
    result["background_load_before"] = background
    return result


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
) -> Row:
    """Row (b) against ``opgate serve`` with OPGATE_WORKERS=``workers`` (fresh listeners, the
    same database and provider), stopped again before returning. Its CPU column is the
    supervisor's and its workers' together."""
    agent_port, ops_port = free_port(), free_port()
    worker_env = env | {
        "OPGATE_AGENT_LISTEN": f"127.0.0.1:{agent_port}",
        "OPGATE_OPS_LISTEN": f"127.0.0.1:{ops_port}",
        "OPGATE_WORKERS": str(workers),
    }
    service = start_service(
        stack, f"opgate-w{workers}", [config.python, "-m", "proxy", "serve"],
        env=worker_env, logs=RESULTS_DIR,
    )  # fmt: skip
    try:
        wait_ready(service, f"http://127.0.0.1:{ops_port}/readyz", timeout=60)
        target = WrkTarget(
            f"opgate_operation_w{workers}", f"opgate (b) {workers} worker{'s' * (workers > 1)}",
            "POST", f"http://127.0.0.1:{agent_port}/bench/v1/refunds", REFUND_BODY,
            token=agent_token, proxy_pid=service.process.pid, provider_pid=provider_pid,
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
        row = measure(replace(config, duration=seconds), target, measure_ids)
        counts = status_counts(db_url, measure_ids[0], measure_per * config.threads)
        row.extra |= {"workers": workers, "rows_by_status": counts}
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
    profile: dict[str, Any] | None,
    elapsed: float,
    opgate_stderr: str,
) -> dict[str, Any]:
    def ratio(a: str, b: str) -> float:
        return round(rows[a].rps / rows[b].rps, 3) if rows[b].rps else 0.0

    def added(a: str, b: str) -> dict[str, float]:
        return {
            "p50_ms": round(rows[a].p50_ms - rows[b].p50_ms, 3),
            "p99_ms": round(rows[a].p99_ms - rows[b].p99_ms, 3),
        }

    operation_share = ratio("opgate_operation", "baseline_post")
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cores": os.cpu_count(),
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
            "workers": {
                str(row.extra["workers"]): {
                    "rps": row.rps,
                    "vs_baseline_post": ratio(row.key, "baseline_post"),
                    "vs_pgbench": ratio(row.key, "pgbench"),
                    "vs_one_worker": ratio(row.key, "opgate_operation_w1")
                    if "opgate_operation_w1" in rows
                    else None,
                }
                for row in rows.values()
                if "workers" in row.extra
            },
        },
        "target": {
            "goal": "opgate (b) >= 50% of the baseline POST throughput, same run",
            "share": operation_share,
            "met": operation_share >= 0.5,
        },
        "profile": profile,
        "opgate_stderr_tail": opgate_stderr,
    }


def print_table(result: dict[str, Any]) -> None:
    header = (
        f"{'row':<24} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}  "
        f"{'CPU ms/req: proxy':>17} {'prov':>5} {'pg':>5} {'wrk':>5} {'irq':>5} {'steal':>5} "
        f"{'all':>5} {'busy':>5}"
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
            f"{row['label']:<24} {row['rps']:>9.1f} {row['p50_ms']:>8.2f} "
            f"{row['p99_ms']:>8.2f} {errors:>7}  {show(cpu.get('proxy')):>17} "
            f"{show(cpu.get('provider')):>5} {show(cpu.get('postgres')):>5} "
            f"{show(cpu.get('load_generator')):>5} {show(cpu.get('interrupts')):>5} "
            f"{show(cpu.get('steal')):>5} {show(cpu.get('machine')):>5} "
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
    print()
    print(
        f"baseline / direct:        GET {ratios['baseline_vs_direct']['get']:.2f}x   "
        f"POST {ratios['baseline_vs_direct']['post']:.2f}x"
    )
    for key, label in (
        ("a_read", "(a) read  vs baseline GET "),
        ("b_operation", "(b) op    vs baseline POST"),
        ("c_rejection", "(c) reject vs baseline POST"),
    ):
        lat = ratios["added_latency_vs_baseline"][key]
        print(
            f"opgate {label}: {ratios['opgate_vs_baseline'][key]:.2f}x throughput, "
            f"+{lat['p50_ms']:.2f} ms p50, +{lat['p99_ms']:.2f} ms p99"
        )
    print(f"opgate (b) / pgbench claim+settle: {ratios['b_operation_vs_pgbench']:.2f}x")
    for workers, figures in ratios["workers"].items():
        scaling = figures["vs_one_worker"]
        print(
            f"opgate (b) with {workers} worker(s): {figures['rps']:.0f} req/s = "
            f"{figures['vs_baseline_post']:.2f}x baseline POST, "
            f"{figures['vs_pgbench']:.2f}x pgbench"
            + (f", {scaling:.2f}x one worker" if scaling is not None else "")
        )
    target = result["target"]
    print(
        f"target (b) >= 0.50x baseline: {target['share']:.2f}x -> "
        f"{'MET' if target['met'] else 'NOT MET'}"
    )
    profile = result.get("profile")
    if profile and "self" in profile:
        print(
            f"\npy-spy on opgate during (b) ({profile['samples']} busy samples, "
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
    elif profile:
        print(f"\nprofile: {profile.get('skipped')}")
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
        default=str(DEFAULT_PYTHON) if DEFAULT_PYTHON.exists() else sys.executable,
        help="the interpreter with opgate installed",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also sample opgate with py-spy during an extra run of (b)",
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
    args = parser.parse_args(argv)
    counts: tuple[int, ...] = ()
    if args.workers_counts != "none":
        counts = tuple(sorted({int(n) for n in args.workers_counts.split(",") if n.strip()}))
    return Config(
        duration=args.duration,
        connections=args.connections,
        threads=args.threads,
        warmup=args.warmup,
        pgbench_clients=args.pgbench_clients,
        admin_url=args.admin_url,
        python=args.python,
        profile=args.profile,
        profile_seconds=args.profile_seconds,
        keep_database=args.keep_database,
        workers_counts=counts,
        workers_duration=args.workers_duration,
    )


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
