"""The cost of synchronous replication for opgate's own statements (docs/running-ha.md).

A primary with a streaming standby on loopback (tests/support/cluster.py, fsync on), opgate's
database migrated on it, and ``--clients`` concurrent clients each running, as fast as they
can, the store calls of an approved operation: create, claim, settle (proxy/store/store.py,
the named statements of queries.sql). Operations per second over ``--seconds``, with the
standby asynchronous (A) and synchronous (B), in the order A B B A, repeated ``--sittings``.

    python bench/sync_commit.py --clients 16 --seconds 10 --sittings 2

Needs root (or the postgres user) and the PostgreSQL binaries, as the tests' cluster does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.store.operation import Status
from proxy.store.store import Claim, NewOperation, ProviderAnswer, Store
from tests.support.cluster import running_cluster
from tests.support.operations import new_operation

_ANSWER = ProviderAnswer(200, "re_1", "application/json", b'{"id": "re_1"}')


def _operation() -> NewOperation:
    return new_operation(f"op_{secrets.token_hex(12)}", approved_by="bench")


async def _client(store: Store, until: float) -> int:
    done = 0
    while time.monotonic() < until:
        new = _operation()
        await store.create(new, actor="bench")
        claimed = await store.claim(
            Claim(new.operation_id, owner="bench", lease_seconds=30, expected_attempts=0)
        )
        assert claimed is not None
        await store.settle(new.operation_id, Status.CONFIRMED, _ANSWER, "bench")
        done += 1
    return done


async def _sitting(dsn: str, clients: int, seconds: float) -> float:
    store = await Store.open(dsn, min_size=clients, max_size=clients)
    try:
        until = time.monotonic() + seconds
        counts = await asyncio.gather(*(_client(store, until) for _ in range(clients)))
    finally:
        await store.close()
    return sum(counts) / seconds


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sittings", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"async": [], "sync": []}
    with running_cluster(sync=False, fsync=True) as cluster:
        dsn = await cluster.create_database("opgate_bench")
        for _ in range(args.sittings):
            for mode in ("async", "sync", "sync", "async"):
                cluster.set_sync(mode == "sync")
                rate = await _sitting(dsn, args.clients, args.seconds)
                results[mode].append(round(rate, 1))
                print(json.dumps({"mode": mode, "ops_per_second": round(rate, 1)}), flush=True)
    a = round(statistics.median(results["async"]), 1)
    s = round(statistics.median(results["sync"]), 1)
    print(
        json.dumps(
            {
                "clients": args.clients,
                "async_median": a,
                "sync_median": s,
                "sync_cost_percent": round(100 * (s - a) / a, 1),
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
