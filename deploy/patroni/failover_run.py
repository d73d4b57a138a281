"""One failover of a 2-node Patroni cluster under a stream of approved refunds through opgate.

Run it through ``deploy/patroni/failover-run.sh`` (it checks what is missing first), as root
or as postgres, from anywhere. It installs nothing. Everything listens on 127.0.0.1 only:

1. etcd (``etcd.yml``) and two Patroni nodes (``node1.yml``, ``node2.yml``: PostgreSQL 15,
   ``synchronous_mode: true``) in a temporary directory owned by postgres; it waits for a
   leader and a synchronous standby (Patroni's REST API).
2. the database ``opgate`` on the leader, ``opgate migrate``, then a real ``opgate serve``
   whose DSN names both nodes with ``target_session_attrs=read-write``, with the shipped
   policies and localstripe (served in this process) as Stripe;
3. agents send approved refunds, each of its own charge (the operations API approves, the
   agent sends with its token); mid-stream the leader's Patroni and PostgreSQL are killed
   with SIGKILL, like a host that died; Patroni promotes the synchronous standby;
4. the stream runs on a few seconds after the first confirmed send, then a replacement
   follows the recovery read (``/_opgate/v1/operations/{id}``) for every operation whose
   send was not answered 200;
5. it counts at localstripe: refunds per operation (never more than one), approvals answered
   201 that are gone, answers by status (503 during the switch, never 500), the times from
   the kill to the promotion and to the first confirmed send; stops everything and prints a
   summary, last a line ``SUMMARY {json}``. Exit 0 when the promises held, 1 otherwise.

With ``--strict`` the cluster runs ``synchronous_mode_strict: true``: the promoted node has no
standby left, so its commits (opgate's claims) wait; after ``--strict-hold`` seconds of that
the killed node is started again, rejoins as the synchronous standby, and commits resume.
docs/patroni.md holds a documented run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import grp
import hashlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from aiohttp import web

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NODES = ("node1", "node2")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
STRIPE_KEY = "sk_test_patroni_failover_run"
AGENT_TOKEN = "opg_patroni_run_agent_" + secrets.token_hex(8)
ADMIN_TOKEN = "opg_patroni_run_admin_" + secrets.token_hex(8)
TENANT = "demo"
REFUND_AMOUNT = 100
CHARGE_AMOUNT = 1000
PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2)
SEND_TIMEOUT = aiohttp.ClientTimeout(total=30)
# Between two attempts of a client whose last one failed: a client's pace, not a wait for a
# state (the states are polled: until()).
FAILED_ATTEMPT_PAUSE_SECONDS = 0.05


def log(message: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
    print(f"{stamp} {message}", flush=True)


async def until(what: str, check: Any, seconds: float, interval: float = 0.1) -> Any:
    """Poll the coroutine function ``check`` until it returns something truthy; fail after
    ``seconds`` naming ``what``."""
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        await asyncio.sleep(interval)


# --- the cluster ---------------------------------------------------------------------------


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


@dataclass
class Node:
    name: str
    config: dict[str, Any]
    config_path: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def api(self) -> str:
        return f"http://{self.config['restapi']['listen']}"

    @property
    def port(self) -> int:
        return host_port(self.config["postgresql"]["listen"])[1]

    @property
    def data_dir(self) -> Path:
        return Path(self.config["postgresql"]["data_dir"])


@dataclass
class Cluster:
    workdir: Path
    etcd_config: Path
    etcd_url: str
    nodes: dict[str, Node]
    logs: Path
    etcd: subprocess.Popen[bytes] | None = None
    run_as: tuple[int, int] | None = None

    def dsn(self, database: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes.values())
        return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        uid, gid = self.run_as if self.run_as is not None else (None, None)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        with (self.logs / f"{name}.log").open("ab") as output:
            # A session of its own: a terminal's ^C reaches this script only, which stops
            # everything in order.
            return subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
                argv,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
                start_new_session=True,
                user=uid,
                group=gid,
                extra_groups=None if uid is None else [],
            )

    def start_etcd(self) -> None:
        self.etcd = self.spawn("etcd", ["etcd", "--config-file", str(self.etcd_config)])

    def start_node(self, node: Node) -> None:
        node.process = self.spawn(node.name, ["patroni", str(node.config_path)])


def prepare_cluster(workdir: Path, *, strict: bool) -> Cluster:
    """Copy the committed files into ``workdir`` with its paths; everything owned by
    postgres, which is who Patroni, PostgreSQL and etcd run as."""
    run_as = None
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        run_as = (entry.pw_uid, grp.getgrnam("postgres").gr_gid)
    logs = workdir / "logs"
    logs.mkdir()
    etcd = yaml.safe_load((HERE / "etcd.yml").read_text("utf-8"))
    etcd["data-dir"] = str(workdir / "etcd")
    etcd_config = workdir / "etcd.yml"
    etcd_config.write_text(yaml.safe_dump(etcd), "utf-8")
    nodes = {}
    for name in NODES:
        config = yaml.safe_load((HERE / f"{name}.yml").read_text("utf-8"))
        config["postgresql"]["data_dir"] = str(workdir / name)
        config["postgresql"]["pgpass"] = str(workdir / f"pgpass-{name}")
        config["postgresql"]["parameters"]["unix_socket_directories"] = str(workdir)
        config["bootstrap"]["dcs"]["synchronous_mode_strict"] = strict
        path = workdir / f"{name}.yml"
        path.write_text(yaml.safe_dump(config), "utf-8")
        nodes[name] = Node(name, config, path)
    if run_as is not None:
        for path in [workdir, *workdir.rglob("*")]:
            os.chown(path, *run_as)
    client_url = etcd["advertise-client-urls"]
    return Cluster(workdir, etcd_config, client_url, nodes, logs, run_as=run_as)


async def rest(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    """GET a Patroni or etcd endpoint: (status, JSON or None); (0, None) when unreachable."""
    try:
        async with session.get(url, timeout=PROBE_TIMEOUT) as answer:
            try:
                body = await answer.json(content_type=None)
            except ValueError:
                body = None
            return answer.status, body
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


async def roles(session: aiohttp.ClientSession, cluster: Cluster) -> dict[str, str]:
    """Each running node's role as Patroni's own REST API reports it (``/patroni``)."""
    seen = {}
    for node in cluster.nodes.values():
        status, body = await rest(session, f"{node.api}/patroni")
        if status and isinstance(body, dict) and body.get("state") == "running":
            seen[node.name] = str(body.get("role"))
    return seen


async def sync_standby(session: aiohttp.ClientSession, node: Node) -> bool:
    # Patroni answers 200 on /sync only on a synchronous standby.
    return (await rest(session, f"{node.api}/sync"))[0] == 200


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant, from /proc."""
    children: dict[int, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children[parent].append(int(entry.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def postmaster_pid(node: Node) -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((node.data_dir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, 0)
        return pid
    return None


def kill_host(node: Node) -> list[int]:
    """SIGKILL the node's Patroni and its PostgreSQL (postmaster and every backend) at once:
    nothing of that host runs a line of code after this."""
    pids = []
    if node.process is not None:
        pids += process_tree(node.process.pid)
    postmaster = postmaster_pid(node)
    if postmaster is not None:
        pids += process_tree(postmaster)
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if node.process is not None:
        node.process.wait()
    return pids


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def stop_cluster(cluster: Cluster) -> None:
    """Patroni stops its PostgreSQL on SIGTERM; a postmaster left behind (its Patroni was
    killed) gets an immediate shutdown; etcd last."""
    for node in cluster.nodes.values():
        stop_process(node.process, 60)
    for node in cluster.nodes.values():
        postmaster = postmaster_pid(node)
        if postmaster is not None:
            os.kill(postmaster, signal.SIGQUIT)
            deadline = time.monotonic() + 30
            while postmaster_pid(node) is not None and time.monotonic() < deadline:
                time.sleep(0.1)
    stop_process(cluster.etcd, 30)


# --- localstripe, served in this process ----------------------------------------------------


@contextlib.asynccontextmanager
async def localstripe_served() -> AsyncIterator[str]:
    """localstripe's aiohttp app on a 127.0.0.1 port of its own, its store in memory only
    (the CLI binds every interface and pickles its store to /tmp/localstripe.pickle)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import localstripe.resources
        import localstripe.server

    def no_disk(_store: object) -> None:
        """Keep localstripe's store in memory."""

    def no_webhook(_event: object) -> None:
        """No webhooks are configured: nothing to schedule."""

    localstripe.resources.Store.dump_to_disk = no_disk
    localstripe.resources.Store.try_load_from_disk = no_disk
    localstripe.resources.schedule_webhook = no_webhook
    localstripe.resources.store.clear()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    runner = web.AppRunner(localstripe.server.app, access_log=None)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()
        sock.close()


class Stripe:
    """Straight at localstripe (never through opgate): the customer's charges, and the
    ground truth of what was refunded."""

    def __init__(self, session: aiohttp.ClientSession, url: str):
        self.session, self.url = session, url
        self.auth = {"Authorization": f"Bearer {STRIPE_KEY}"}

    async def charge(self) -> str:
        form = {"amount": str(CHARGE_AMOUNT), "currency": "usd", "source": "pm_card_visa"}
        async with self.session.post(
            f"{self.url}/v1/charges", data=form, headers=self.auth
        ) as answer:
            body = await answer.json()
            if answer.status != 200:
                raise RuntimeError(f"localstripe refused a charge: {answer.status} {body}")
            return str(body["id"])

    async def refunds(self, charge: str) -> list[dict[str, Any]]:
        query = {"charge": charge, "limit": "100"}
        async with self.session.get(
            f"{self.url}/v1/refunds", params=query, headers=self.auth
        ) as answer:
            body = await answer.json()
            if answer.status != 200 or body.get("has_more"):
                raise RuntimeError(f"localstripe refunds of {charge}: {answer.status} {body}")
            return list(body["data"])


# --- opgate ----------------------------------------------------------------------------------


@dataclass
class Opgate:
    process: subprocess.Popen[bytes]
    log_path: Path
    agent_url: str = ""
    ops_url: str = ""


def opgate_env(cluster: Cluster, stripe_url: str) -> dict[str, str]:
    agent = {"id": "agent-1", "tenant": TENANT, "token_sha256": sha256(AGENT_TOKEN)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPGATE_")}
    env.update(
        OPGATE_DATABASE_URL=cluster.dsn("opgate"),
        OPGATE_POLICY_DIR=str(REPO / "policies"),
        OPGATE_DATA_DIR=str(cluster.workdir / "opgate"),
        OPGATE_AGENT_LISTEN="127.0.0.1:0",
        OPGATE_OPS_LISTEN="127.0.0.1:0",
        OPGATE_FORWARD_LISTEN="",
        OPGATE_WORKERS="1",
        OPGATE_ADMIN_TOKEN_SHA256=sha256(ADMIN_TOKEN),
        OPGATE_AGENTS=json.dumps([agent]),
        OPGATE_UPSTREAM_OVERRIDES=json.dumps({"stripe": stripe_url}),
        OPGATE_SECRET_STRIPE_API_KEY=STRIPE_KEY,
        OPGATE_SECRET_AUDIT_KEY="patroni-run-" + secrets.token_hex(16),
    )
    return env


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def opgate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", *args]


async def migrate(cluster: Cluster, leader: Node, env: dict[str, str]) -> None:
    connection = await asyncpg.connect(
        host="127.0.0.1", port=leader.port, user="postgres", database="postgres"
    )
    try:
        await connection.execute("CREATE DATABASE opgate")
    finally:
        await connection.close()
    process = await asyncio.create_subprocess_exec(
        *opgate_command("migrate"), env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"opgate migrate failed ({process.returncode}): {output.decode()}")


def spawn_opgate(env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as output:
        return subprocess.Popen(  # noqa: S603 (fixed argv, no shell)
            opgate_command("serve"), env=env, cwd=REPO, stdout=output, stderr=subprocess.STDOUT
        )


async def start_opgate(
    session: aiohttp.ClientSession, cluster: Cluster, env: dict[str, str]
) -> Opgate:
    log_path = cluster.logs / "opgate.log"
    process = spawn_opgate(env, log_path)
    gate = Opgate(process, log_path)

    async def started() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"opgate exited {process.returncode}: see {log_path}")
        for raw in log_path.read_text("utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict) and line.get("event") == "opgate_started":
                    gate.agent_url, gate.ops_url = line["agent_url"], line["ops_url"]
                    return True
        return False

    await until("opgate to start", started, 60)

    async def ready() -> bool:
        return (await rest(session, f"{gate.ops_url}/readyz"))[0] == 200

    await until("opgate /readyz", ready, 60)
    return gate


async def audit_verify(env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *opgate_command("audit", "verify"),
        env=env,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    lines = output.decode("utf-8", errors="replace").strip().splitlines()
    return process.returncode or 0, lines[-1] if lines else ""


# --- the stream --------------------------------------------------------------------------------


@dataclass
class Operation:
    id: str
    key: str
    charge: str
    send_statuses: list[str] = field(default_factory=list)
    confirmed: bool = False
    recovery: str = ""


@dataclass
class Stream:
    started: float
    answers: collections.Counter[str] = field(default_factory=collections.Counter)
    operations: list[Operation] = field(default_factory=list)
    # (monotonic start, monotonic answer) of every send answered 200
    confirmed: list[tuple[float, float]] = field(default_factory=list)
    # seconds each send not answered 200 took to be answered
    refused_seconds: list[float] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    # approved, not yet sent; None ends the stream. Bounded: at the kill, up to this many
    # approvals wait to be sent, and are sent into the outage.
    approved: asyncio.Queue[Operation | None] = field(
        default_factory=lambda: asyncio.Queue(maxsize=64)
    )


def problem_code(body: Any) -> str:
    """opgate's code: problem+json's ``code``, or Stripe's error shape (``errors: stripe``)."""
    if isinstance(body, dict):
        if isinstance(body.get("code"), str):
            return str(body["code"])
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            return str(error["code"])
    return ""


async def call(
    session: aiohttp.ClientSession, method: str, url: str, **kwargs: Any
) -> tuple[str, Any]:
    """(``"STATUS code"`` or ``"error Name"``, JSON body or None)."""
    try:
        async with session.request(method, url, timeout=SEND_TIMEOUT, **kwargs) as answer:
            try:
                body = await answer.json(content_type=None)
            except ValueError:
                body = None
            return f"{answer.status} {problem_code(body)}".strip(), body
    except (aiohttp.ClientError, TimeoutError) as error:
        return f"error {type(error).__name__}", None


def refund_form(operation: Operation) -> dict[str, str]:
    return {"charge": operation.charge, "amount": str(REFUND_AMOUNT)}


async def approve(
    session: aiohttp.ClientSession, stripe: Stripe, gate: Opgate, stream: Stream
) -> Operation | None:
    """The application's approval step: a refund of a fresh charge, approved through the
    operations API; None when the approval was refused."""
    charge = await stripe.charge()
    approval = {
        "tenant": TENANT,
        "provider": "stripe",
        "action": "refund.create",
        "amount": REFUND_AMOUNT,
        "params": {"charge": charge},
        "approval_ref": "patroni-run",
        "approved_by": "failover-run@example.com",
        "ttl_seconds": 3600,
    }
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    answer, body = await call(
        session, "POST", f"{gate.ops_url}/v1/operations", json=approval, headers=admin
    )
    stream.answers[f"approve {answer}"] += 1
    if not answer.startswith("201"):
        return None
    operation = Operation(body["operation_id"], body["idempotency_key"], charge)
    stream.operations.append(operation)
    return operation


async def approver(
    session: aiohttp.ClientSession, stripe: Stripe, gate: Opgate, stream: Stream
) -> None:
    """Approvals queued for the agents, until told to stop. Approvals outpace sends, so the
    queue is full when the leader dies: those approvals are sent into the outage."""
    while not stream.stop.is_set():
        operation = await approve(session, stripe, gate, stream)
        if operation is None:
            await asyncio.sleep(FAILED_ATTEMPT_PAUSE_SECONDS)
            continue
        await stream.approved.put(operation)


async def send(
    session: aiohttp.ClientSession, gate: Opgate, stream: Stream, operation: Operation
) -> str:
    """One send of an approved refund with the agent's token: its tally key."""
    headers = {"Authorization": f"Bearer {AGENT_TOKEN}", "Idempotency-Key": operation.key}
    sent = time.monotonic()
    answer, _ = await call(
        session,
        "POST",
        f"{gate.agent_url}/stripe/v1/refunds",
        data=refund_form(operation),
        headers=headers,
    )
    stream.answers[f"send {answer}"] += 1
    operation.send_statuses.append(answer)
    if answer.startswith("200"):
        operation.confirmed = True
        stream.confirmed.append((sent, time.monotonic()))
    else:
        stream.refused_seconds.append(time.monotonic() - sent)
    return answer


async def agent(session: aiohttp.ClientSession, gate: Opgate, stream: Stream) -> None:
    """Send each approved refund once, until the approvals end. A send not answered 200 is
    left to the recovery read, after the stream."""
    while (operation := await stream.approved.get()) is not None:
        if not (await send(session, gate, stream, operation)).startswith("200"):
            await asyncio.sleep(FAILED_ATTEMPT_PAUSE_SECONDS)
    await stream.approved.put(None)


async def recover(
    session: aiohttp.ClientSession, gate: Opgate, stream: Stream, operation: Operation
) -> None:
    """A replacement agent that knows only the operation id follows the recovery read
    (as tests/support/recovery_agent.py does), for at most two minutes."""
    auth = {"Authorization": f"Bearer {AGENT_TOKEN}"}
    url = f"{gate.agent_url}/_opgate/v1/operations/{operation.id}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer, view = await call(session, "GET", url, headers=auth)
        if not answer.startswith("200") or not isinstance(view, dict):
            stream.answers[f"recovery read {answer}"] += 1
            await asyncio.sleep(0.5)
            continue
        action = str(view.get("next_action"))
        if action in ("proceed", "new_approval_required", "escalated"):
            operation.recovery = action
            return
        if action in ("send", "retry"):
            request = view["request"]
            answer, _ = await call(
                session,
                request["method"],
                gate.agent_url + request["path"],
                headers={**request["headers"], **auth},
                data=request.get("form"),
                json=request.get("json"),
            )
            stream.answers[f"recovery send {answer}"] += 1
            operation.send_statuses.append(answer)
            if not answer.startswith("2"):
                await asyncio.sleep(FAILED_ATTEMPT_PAUSE_SECONDS)
            continue
        await asyncio.sleep(min(float(view.get("retry_after_seconds") or 0.2), 5.0))
    operation.recovery = "gave up after 120 s"


# --- the run -------------------------------------------------------------------------------


@dataclass
class Times:
    kill: float = 0.0
    promoted: float = 0.0
    rejoined_started: float = 0.0
    first_confirmed_after_kill: float = 0.0


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cluster = prepare_cluster(workdir, strict=args.strict)
    gate: Opgate | None = None
    times = Times()
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{os.cpu_count()} cores",
        "synchronous_mode_strict": args.strict,
    }
    connector = aiohttp.TCPConnector(limit=0)
    try:
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            localstripe_served() as stripe_url,
        ):
            # 1. etcd, then node1 (it bootstraps the cluster), then node2 (it clones node1)
            cluster.start_etcd()

            async def etcd_up() -> bool:
                return (await rest(session, f"{cluster.etcd_url}/health"))[0] == 200

            await until("etcd", etcd_up, 30)
            first, second = cluster.nodes.values()
            cluster.start_node(first)

            async def leader_up() -> bool:
                return (await roles(session, cluster)).get(first.name) == "master"

            await until(f"{first.name} to lead", leader_up, 90)
            cluster.start_node(second)

            async def standby_sync() -> bool:
                return await sync_standby(session, second)

            await until(f"{second.name} to be the synchronous standby", standby_sync, 90)
            log(f"cluster up: {first.name} leads, {second.name} is the synchronous standby")

            # 2. opgate's database, schema and process
            env = opgate_env(cluster, stripe_url)
            await migrate(cluster, first, env)
            gate = await start_opgate(session, cluster, env)
            log(f"opgate serving at {gate.agent_url} (ops {gate.ops_url})")
            log(f"DSN {cluster.dsn('opgate')}")

            # 3. the stream, and the kill mid-stream
            stripe = Stripe(session, stripe_url)
            stream = Stream(time.monotonic())
            approvers = [
                asyncio.create_task(approver(session, stripe, gate, stream))
                for _ in range(args.approvers)
            ]
            agents = [
                *approvers,
                *(asyncio.create_task(agent(session, gate, stream)) for _ in range(args.agents)),
            ]

            async def warmed_up() -> bool:
                for task in agents:
                    if task.done():
                        task.result()  # an agent that crashed stops the run with its error
                return bool(
                    len(stream.confirmed) >= args.warmup_sends
                    and time.monotonic() - stream.started >= args.warmup_seconds
                )

            await until("the stream to warm up", warmed_up, 60)
            # Approved before the kill and kept aside: in strict mode, sent while the
            # promoted node has no standby (when no new approval can commit).
            reserve: list[Operation] = []
            while args.strict and len(reserve) < args.agents:
                operation = await approve(session, stripe, gate, stream)
                if operation is not None:
                    reserve.append(operation)
            leader_name = next(
                (n for n, r in (await roles(session, cluster)).items() if r == "master"), ""
            )
            leader = cluster.nodes[leader_name]
            survivor = next(n for n in cluster.nodes.values() if n is not leader)
            times.kill = time.monotonic()
            killed = kill_host(leader)
            log(
                f"SIGKILL {leader.name}'s Patroni and PostgreSQL ({len(killed)} processes) "
                f"after {len(stream.confirmed)} confirmed sends"
            )

            async def promoted() -> bool:
                return (await roles(session, cluster)).get(survivor.name) == "master"

            await until(f"{survivor.name} to be promoted", promoted, 120)
            times.promoted = time.monotonic()
            log(f"{survivor.name} promoted {times.promoted - times.kill:.1f} s after the kill")

            def confirmed_after_kill() -> list[tuple[float, float]]:
                return [c for c in stream.confirmed if c[0] > times.kill]

            if args.strict:
                # The promoted node has no standby: synchronous_standby_names stays '*' and
                # every commit (opgate's claims) waits. Hold, then bring the old node back.
                held = time.monotonic() + args.strict_hold

                async def timed_send(operation: Operation) -> tuple[str, float]:
                    started = time.monotonic()
                    answer = await send(session, gate, stream, operation)
                    return answer, time.monotonic() - started

                # No approval can commit now: the ones kept aside show what a send gets.
                reserve_sent = asyncio.gather(*(timed_send(op) for op in reserve))
                readyz: collections.Counter[str] = collections.Counter()
                while time.monotonic() < held:
                    probe, body = await rest(session, f"{gate.ops_url}/readyz")
                    detail = body.get("detail", "") if isinstance(body, dict) else ""
                    readyz[f"{probe} {detail[:40]}".strip()] += 1
                    await asyncio.sleep(0.5)  # a probe's period
                summary["readyz_while_no_standby"] = dict(readyz)
                summary["reserve_sends_while_no_standby"] = [
                    {"answer": answer, "seconds": round(seconds, 2)}
                    for answer, seconds in await reserve_sent
                ]
                summary["confirmed_while_no_standby"] = len(confirmed_after_kill())
                times.rejoined_started = time.monotonic()
                cluster.start_node(leader)
                log(f"{leader.name} started again after {args.strict_hold:.0f} s without standby")

            async def confirmed_again() -> bool:
                return bool(confirmed_after_kill())

            await until("a confirmed send after the kill", confirmed_again, 120, 0.01)
            times.first_confirmed_after_kill = min(c[1] for c in confirmed_after_kill())
            log(
                "first confirmed send "
                f"{times.first_confirmed_after_kill - times.kill:.2f} s after the kill"
            )
            await asyncio.sleep(args.after_seconds)  # the stream runs on for a while
            stream.stop.set()
            await asyncio.gather(*approvers)
            await stream.approved.put(None)  # the end of the stream, passed on by each agent
            await asyncio.gather(*agents)

            # 4. the replacements: every operation whose send was not answered 200
            pending = [op for op in stream.operations if not op.confirmed]
            log(f"stream stopped; recovery read for {len(pending)} operations")
            await asyncio.gather(*(recover(session, gate, stream, op) for op in pending))

            # 5. count at the provider and in opgate. A send answered 200 whose outcome
            # could not be recorded (the primary died after the provider answered) leaves
            # its row dispatched: its recovery read asks Stripe and settles it.
            admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

            async def row_status(operation: Operation) -> str | None:
                url = f"{gate.ops_url}/v1/operations/{operation.id}"
                answer, row = await call(session, "GET", url, headers=admin)
                return str(row.get("status")) if answer.startswith("200") else None

            before = {op.id: await row_status(op) for op in stream.operations}
            left_dispatched = [op for op in stream.operations if before[op.id] == "dispatched"]
            await asyncio.gather(*(recover(session, gate, stream, op) for op in left_dispatched))
            refunds_per_operation: collections.Counter[int] = collections.Counter()
            over_refunded: list[str] = []
            approvals_missing: list[str] = []
            statuses: collections.Counter[str] = collections.Counter()
            for operation in stream.operations:
                refunds = await stripe.refunds(operation.charge)
                refunds_per_operation[len(refunds)] += 1
                if len(refunds) > 1:
                    over_refunded.append(operation.id)
                row = await row_status(operation)
                if row is None:
                    approvals_missing.append(operation.id)
                statuses[str(row)] += 1
            summary["status_after_stream"] = dict(
                sorted(collections.Counter(str(v) for v in before.values()).items())
            )
            summary["answered_200_left_dispatched"] = sum(op.confirmed for op in left_dispatched)
            code, verify_line = await audit_verify(env)
            answers = dict(sorted(stream.answers.items()))
            summary.update(
                operations_approved=len(stream.operations),
                operations_confirmed_first_send=sum(
                    op.send_statuses[:1] == ["200"] for op in stream.operations
                ),
                refunds_per_operation={str(k): v for k, v in sorted(refunds_per_operation.items())},
                max_refunds_per_operation=max(refunds_per_operation, default=0),
                operations_refunded_twice=over_refunded,
                approvals_missing=approvals_missing,
                final_status=dict(sorted(statuses.items())),
                recovery=dict(
                    collections.Counter(op.recovery for op in [*pending, *left_dispatched])
                ),
                answers=answers,
                refused_send_seconds={
                    "median": round(statistics.median(stream.refused_seconds), 3),
                    "max": round(max(stream.refused_seconds), 3),
                }
                if stream.refused_seconds
                else {},
                answers_500=sum(v for k, v in answers.items() if http_status(k) == "500"),
                kill_to_promotion_seconds=round(times.promoted - times.kill, 2),
                kill_to_first_confirmed_seconds=round(
                    times.first_confirmed_after_kill - times.kill, 2
                ),
                promotion_to_first_confirmed_seconds=round(
                    times.first_confirmed_after_kill - times.promoted, 3
                ),
                audit_verify={"exit": code, "last_line": verify_line[:300]},
            )
            if args.strict:
                summary["rejoin_to_first_confirmed_seconds"] = round(
                    times.first_confirmed_after_kill - times.rejoined_started, 2
                )
    finally:
        if gate is not None:
            stop_process(gate.process, 60)
        stop_cluster(cluster)
    summary["ok"] = bool(
        summary.get("max_refunds_per_operation", 2) <= 1
        and summary.get("answers_500", 1) == 0
        and not summary.get("approvals_missing", ["?"])
    )
    return summary


def http_status(answer: str) -> str:
    """The status in a tally key such as ``send 503 store_unavailable`` ("" for errors)."""
    return next((word for word in answer.split() if word.isdigit() and len(word) == 3), "")


def report(summary: dict[str, Any]) -> None:
    print()
    for key, value in summary.items():
        if isinstance(value, dict) and value:
            print(f"{key}:")
            for inner, count in value.items():
                print(f"    {inner}: {count}")
        else:
            print(f"{key}: {value}")
    print("SUMMARY " + json.dumps(summary, sort_keys=True), flush=True)


@contextlib.contextmanager
def working_directory(keep: bool) -> Iterator[Path]:
    """A temporary directory, removed afterwards unless kept (always kept after a failure,
    for its logs)."""
    workdir = Path(tempfile.mkdtemp(prefix="opgate-patroni-"))
    try:
        yield workdir
    except BaseException:
        keep = True
        raise
    finally:
        if keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--approvers", type=int, default=4, help="concurrent approvals (4)")
    parser.add_argument("--agents", type=int, default=4, help="concurrent agents (4)")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--warmup-sends", type=int, default=20)
    parser.add_argument(
        "--after-seconds", type=float, default=3.0, help="stream time after the first send"
    )
    parser.add_argument("--strict", action="store_true", help="synchronous_mode_strict: true")
    parser.add_argument("--strict-hold", type=float, default=10.0)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args()
    with working_directory(args.keep) as workdir:
        log(f"working in {workdir}")
        try:
            summary = asyncio.run(run(args, workdir))
        except (RuntimeError, OSError) as error:
            log(f"failed: {error}; logs in {workdir / 'logs'}")
            raise SystemExit(2) from None
    report(summary)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
