"""Forward mode's egress session: it sends a claimed request at most once, like reverse mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.errors import UpstreamDropped
from tests.support.closing_upstream import closing_upstream, send_twice_on_one_connection
from tests.support.opgate import StartOpgate, fault_policy


@pytest.mark.parametrize("stop_listening", [False, True], ids=["listening", "stops-listening"])
@pytest.mark.parametrize("method", ["PUT", "DELETE"])
async def test_the_forward_listener_session_never_resends(
    start_opgate: StartOpgate,
    policy_dir: Path,
    tmp_path: Path,
    method: str,
    stop_listening: bool,
) -> None:
    """The session forward-mode requests leave through does not re-send a request the
    provider read before closing the pooled connection, and calls it dropped."""
    (policy_dir / "fault.yaml").write_text(fault_policy(deduplicates=False))
    async with (
        closing_upstream(stop_listening=stop_listening) as provider,
        start_opgate(forward_listen="127.0.0.1:0", ca_dir=tmp_path / "ca") as gate,
    ):
        forward_client = gate.running.gateway.forward_client
        assert forward_client is not None
        error = await send_twice_on_one_connection(forward_client, method, provider.url)
    assert [r.target for r in provider.requests] == ["/v1/items/first", "/v1/items/second"]
    assert provider.requests[0].connection == provider.requests[1].connection
    assert isinstance(error, UpstreamDropped), repr(error)
