"""Two opgates, A and B, measured interleaved: the A/B of one change, in one sitting.

    python bench/ab.py --a-tree ../before --b-tree . [--rounds 8] [--seconds 3]
    python bench/ab.py --a-env OPGATE_POOL_MAX_SIZE=4   # two settings, one tree
    python bench/ab.py --a-tree ../before --rows f --rate 200 --seconds 8   # latency, open loop

On a shared 2-core VM the CPU per request drifts by 20% or more between runs minutes apart,
which hides a 5-10% change between two full ``bench/run.py`` runs. Here both opgates run at
once (each on its own bench database, the same provider), and short wrk bursts alternate between
them, A B B A A B..., so that a drift falls on both alike. Per burst: opgate's own CPU and its
database's backends' CPU per request (from /proc), for row (b) (every request a fresh approved
operation) and row (a) (a read, no operation); for row (f), row (b) at a fixed arrival rate
(bench/open_loop.py), its p50 and p99 latency. The medians and the B/A ratios are printed and
written to bench/results/ab.json. Standard library only, like run.py, whose parts it reuses.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import run

RANGE_BASE = 1_000_000  # operation ids: side A from here, side B RANGE_BASE further


@dataclass
class Side:
    name: str
    tree: Path
    db_url: str
    pid: int = 0
    agent_url: str = ""
    next_id: int = 0
    fixed_blocks: int = 0  # open-loop bursts made (each its own block of operations)
    samples: dict[str, list[dict[str, float]]] = field(default_factory=dict)


def start_side(
    stack: contextlib.ExitStack,
    side: Side,
    config: run.Config,
    env: dict[str, str],
    policy_dir: Path,
    tmp: Path,
    token: str,
    secret: str,
) -> None:
    agent_port, ops_port = run.free_port(), run.free_port()
    environment = run.opgate_environment(
        side.db_url, policy_dir, tmp / f"data-{side.name}", agent_port, ops_port, token, secret
    )
    service = run.start_service(
        stack,
        f"ab-opgate-{side.name}",
        [config.python, "-m", "proxy", "serve"],
        env=environment | env,
        logs=run.RESULTS_DIR,
        cwd=side.tree,
    )
    run.wait_ready(service, f"http://127.0.0.1:{ops_port}/readyz", timeout=60)
    side.pid, side.agent_url = service.process.pid, f"http://127.0.0.1:{agent_port}/bench"


# What each row's bursts report: wrk's closed-loop rows, and the open-loop row f.
KEYS = {
    "a": ("rps", "opgate_ms", "pg_ms", "machine_ms"),
    "b": ("rps", "opgate_ms", "pg_ms", "machine_ms"),
    "f": ("p50_ms", "p99_ms", "opgate_ms", "machine_ms"),
}


def fixed_burst(config: run.Config, side: Side, seconds: int, rate: float) -> dict[str, float]:
    """Row (b) at a fixed arrival rate (bench/open_loop.py, as run.py's fixed-rate rows): its
    latency from the scheduled time, p50 and p99, and CPU ms per request. Each burst takes the
    next block of fresh operations of its side's database."""
    target = run.WrkTarget(
        "ab", f"{side.name} (b) @{rate:g}/s", "POST", side.agent_url + "/v1/refunds",
        run.REFUND_BODY, token=TOKEN[0], proxy_pid=side.pid,
    )  # fmt: skip
    row = run.measure_fixed_rate(
        replace(config, fixed_duration=seconds, warmup=1),
        side.db_url, target, rate, side.fixed_blocks, fresh=True,
    )  # fmt: skip
    side.fixed_blocks += 1
    if not row.valid or row.cpu_ms_per_request is None:
        raise run.BenchError(f"{target.label}: {row.problems}")
    return {
        "p50_ms": row.p50_ms,
        "p99_ms": row.p99_ms,
        "opgate_ms": row.cpu_ms_per_request.proxy or 0.0,
        "machine_ms": row.cpu_ms_per_request.machine,
    }


def burst(
    config: run.Config, side: Side, row: str, seconds: int, rate: float = 200.0
) -> dict[str, float]:
    """One burst of ``row`` against ``side``: for wrk's rows (a) and (b), requests/s and CPU ms
    per request; for (f), ``fixed_burst``."""
    if row == "f":
        return fixed_burst(config, side, seconds, rate)
    if row == "b":
        per = 3000 * seconds  # per wrk thread, far above what one burst can send
        ids = (side.next_id, per)
        run.insert_operations(side.db_url, side.next_id, per * config.threads)
        side.next_id += per * config.threads
        target = run.WrkTarget(
            "ab", f"{side.name} (b)", "POST", side.agent_url + "/v1/refunds",
            run.REFUND_BODY, token=TOKEN[0], proxy_pid=side.pid,
        )  # fmt: skip
    else:
        ids = None
        target = run.WrkTarget(
            "ab", f"{side.name} (a)", "GET", side.agent_url + run.READ_PATH,
            token=TOKEN[0], proxy_pid=side.pid,
        )  # fmt: skip
    backends = run.bench_backends(side.db_url)
    pg_before = sum(run.process_cpu_seconds(p) or 0.0 for p in backends)
    summary, cpu = run.run_wrk(replace(config, duration=seconds), target, seconds, ids)
    pg_after = sum(run.process_cpu_seconds(p) or 0.0 for p in backends)
    requests = int(summary["requests"])
    bad = {s: n for s, n in summary["statuses"].items() if int(s) != 200}
    if bad or requests == 0:
        raise run.BenchError(f"{target.label}: statuses {summary['statuses']}")
    return {
        "rps": requests / (summary["duration_us"] / 1e6),
        "opgate_ms": cpu.proxy or 0.0,
        "pg_ms": (pg_after - pg_before) * 1000 / requests,
        "machine_ms": cpu.machine,
    }


TOKEN: list[str] = []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a-tree", type=Path, default=run.REPO, help="side A's repository")
    parser.add_argument("--b-tree", type=Path, default=run.REPO, help="side B's repository")
    parser.add_argument("--a-env", action="append", default=[], help="OPGATE_X=value for A")
    parser.add_argument("--b-env", action="append", default=[], help="OPGATE_X=value for B")
    parser.add_argument("--rounds", type=int, default=8, help="bursts per side and row")
    parser.add_argument("--seconds", type=int, default=3, help="seconds per burst")
    parser.add_argument(
        "--rows", default="b,a", help="b (operation), a (read), f (operation at --rate, open loop)"
    )
    parser.add_argument("--rate", type=float, default=200.0, help="row f's requests per second")
    parser.add_argument("--python", default=run.default_python())
    parser.add_argument("--admin-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args(argv)
    config = run.parse_args(["--python", args.python, "--admin-url", args.admin_url])
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    envs = {
        "A": dict(item.split("=", 1) for item in args.a_env),
        "B": dict(item.split("=", 1) for item in args.b_env),
    }
    run.RESULTS_DIR.mkdir(exist_ok=True)
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opgate-ab-")))
        sides = [
            Side(
                name,
                tree.resolve(),
                stack.enter_context(run.bench_database(args.admin_url, False, f"_{name.lower()}")),
            )
            for name, tree in (("A", args.a_tree), ("B", args.b_tree))
        ]
        provider_port = run.free_port()
        provider = run.start_service(
            stack, "ab-provider",
            [config.python, str(run.BENCH_DIR / "provider.py"), "--port", str(provider_port)],
            logs=run.RESULTS_DIR,
        )  # fmt: skip
        provider_url = f"http://127.0.0.1:{provider_port}"
        run.wait_ready(provider, provider_url + "/healthz")
        policy_dir = tmp / "policies"
        policy_dir.mkdir()
        (policy_dir / "bench.yaml").write_text(
            run.POLICY_TEMPLATE.format(provider=run.PROVIDER, upstream=provider_url)
        )
        TOKEN.append("opg_bench_" + secrets.token_urlsafe(24))
        secret = "sk_bench_" + secrets.token_hex(8)
        for index, side in enumerate(sides):
            side.next_id = RANGE_BASE * (index + 1) * 10
            start_side(
                stack, side, config, envs[side.name],
                policy_dir, tmp, TOKEN[0], secret,
            )  # fmt: skip
        for side in sides:  # warm-up, not counted
            for row in rows:
                burst(config, side, row, 1, args.rate)
        order = [sides[0], sides[1]]
        for round_number in range(args.rounds):
            for side in order:
                for row in rows:
                    sample = burst(config, side, row, args.seconds, args.rate)
                    side.samples.setdefault(row, []).append(sample)
            order.reverse()  # A B, B A, A B...: a drift falls on both alike
            print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
    result = summarise(sides, rows, args)
    (run.RESULTS_DIR / "ab.json").write_text(json.dumps(result, indent=2) + "\n")
    print_summary(result)
    return 0


def summarise(sides: list[Side], rows: list[str], args: argparse.Namespace) -> dict[str, Any]:
    medians: dict[str, dict[str, dict[str, float]]] = {}
    for side in sides:
        medians[side.name] = {
            row: {
                key: round(statistics.median(s[key] for s in side.samples[row]), 4)
                for key in KEYS[row]
            }
            for row in rows
        }
    ratios = {
        row: {
            key: round(medians["B"][row][key] / medians["A"][row][key], 3)
            for key in KEYS[row]
            if medians["A"][row][key]
        }
        for row in rows
    }
    return {
        "commit": run.git_commit(),
        "a": {"tree": str(sides[0].tree), "env": args.a_env},
        "b": {"tree": str(sides[1].tree), "env": args.b_env},
        "rounds": args.rounds,
        "seconds": args.seconds,
        "medians": medians,
        "b_over_a": ratios,
        "samples": {side.name: side.samples for side in sides},
    }


def print_summary(result: dict[str, Any]) -> None:
    print(f"A: {result['a']}\nB: {result['b']}")
    for row, ratio in result["b_over_a"].items():
        keys = KEYS[row]
        print(f"{'row':<6}{'side':<6}" + "".join(f"{key:>12}" for key in keys))
        for name in ("A", "B"):
            m = result["medians"][name][row]
            print(f"{row:<6}{name:<6}" + "".join(f"{m[key]:>12.3f}" for key in keys))
        print(f"{row:<6}{'B/A':<6}" + "".join(f"{ratio.get(key, 0):>12.3f}" for key in keys))


if __name__ == "__main__":
    sys.exit(main())
