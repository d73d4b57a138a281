"""A replacement agent, as a separate process: it knows only an operation id (and its own
token and opgate's address) and follows the recovery protocol, not its own judgement.

    python -m tests.support.recovery_agent AGENT_URL TOKEN OPERATION_ID

Prints one JSON line with the final recovery view and exits 0 when the work is done
(``proceed``), 3 when a new approval is required, 4 when a human must decide.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import requests

EXIT_DONE, EXIT_NEW_APPROVAL, EXIT_ESCALATED = 0, 3, 4
MAX_STEPS = 200  # a bounded agent: it gives up rather than loop forever


def follow(agent_url: str, token: str, operation_id: str) -> tuple[int, dict[str, Any]]:
    session = requests.Session()
    session.trust_env = False
    session.headers["Authorization"] = f"Bearer {token}"
    view: dict[str, Any] = {}
    for _ in range(MAX_STEPS):
        answer = session.get(f"{agent_url}/_opgate/v1/operations/{operation_id}", timeout=30)
        answer.raise_for_status()
        view = answer.json()
        action = view["next_action"]
        if action == "proceed":
            return EXIT_DONE, view
        if action == "new_approval_required":
            return EXIT_NEW_APPROVAL, view
        if action == "escalated":
            return EXIT_ESCALATED, view
        if action in ("send", "retry"):
            approved = view["request"]
            session.request(
                approved["method"],
                agent_url + approved["path"],
                headers=approved["headers"],
                data=approved.get("form"),
                json=approved.get("json"),
                timeout=30,
            )
            continue  # whatever the answer, the row says what happened: ask again
        # wait (an attempt or a reconciliation is in flight), or reconcile (opgate asked the
        # provider during this read and could not settle yet): ask again when told to
        time.sleep(min(float(view.get("retry_after_seconds") or 0.2), 5.0))
    raise SystemExit(f"gave up after {MAX_STEPS} steps: {view}")


def main() -> int:
    agent_url, token, operation_id = sys.argv[1:4]
    code, view = follow(agent_url, token, operation_id)
    print(json.dumps(view))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
