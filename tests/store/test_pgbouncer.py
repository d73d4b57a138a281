"""opgate through a real PgBouncer in transaction pooling mode: the same guarantees."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.fault_provider import FaultMode, FaultProvider
from tests.support.opgate import StartOpgate, fault_policy, problem
from tests.support.pgbouncer import available, pgbouncer_in_front_of, reaches_over_tcp

pytestmark = pytest.mark.skipif(
    not available(),
    reason="PgBouncer is not installed (Debian package pgbouncer; .ci/run installs it)",
)
GOOD_BODY = "amount=500&currency=usd&charge=ch_1"


async def test_the_pipeline_works_through_pgbouncer_transaction_pooling(
    start_opgate: StartOpgate,
    policy_dir: Path,
    fault_provider: FaultProvider,
    database_url: str,
) -> None:
    """Through PgBouncer (statement cache off): migrations, approvals, a race of 30 identical
    requests (one forwarded), an unknown outcome, replay and reconciliation all hold."""
    if not reaches_over_tcp(database_url):
        pytest.skip("PgBouncer needs a PostgreSQL over TCP (set OPGATE_TEST_DATABASE_URL)")
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False, grace_seconds=30))
    async with (
        pgbouncer_in_front_of(database_url) as bounced,
        start_opgate(
            database_url=bounced,
            database_statement_cache_size=0,
            upstream_overrides={"fault": fault_provider.url},
        ) as gate,
    ):
        op = await gate.approve()
        headers = {"X-Operation-Id": op["operation_id"]}
        results = await asyncio.gather(
            *(gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=headers) for _ in range(30))
        )
        assert len(fault_provider.requests) == 1
        assert sorted({status for status, _, _ in results}) in ([200], [200, 409])
        status, replayed, _ = await gate.send("/fault/v1/refunds", data=GOOD_BODY, headers=headers)
        assert (status, replayed["Idempotent-Replayed"]) == (200, "true")

        lost = await gate.approve(params={"charge": "ch_2"})
        fault_provider.mode = FaultMode.DROP_AFTER_COMMIT
        status, _, body = await gate.send(
            "/fault/v1/refunds",
            data="amount=500&currency=usd&charge=ch_2",
            headers={"X-Operation-Id": lost["operation_id"]},
        )
        assert (status, problem(body)["code"]) == (502, "outcome_unknown")
        fault_provider.mode = FaultMode.OK
        status, _, body = await gate.send(
            f"/_opgate/v1/operations/{lost['operation_id']}",
            method="GET",
            data=None,
            content_type=None,
        )
        assert status == 200
        assert problem(body)["next_action"] == "proceed"
    assert len(fault_provider.effects) == 2
