"""``POST /v1/explain`` on the operations API, and the store-backed explanation it shares with
``opgate policy explain --operation-id``: the operation is read the way the pipeline reads it.

Body (JSON): ``method``, ``path`` (with the route prefix), optional ``headers`` (object),
``body`` (text), ``operation_id`` (added as ``X-Operation-Id`` unless the request names an
operation itself), ``agent`` (``{"id", "tenant"}``; default: the operation's, else a
placeholder agent) and ``lookups`` (answers to the rule's precondition lookups, by path and
query, as in a test case: the provider is not asked). Nothing is claimed, sent or recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.admin.access import admin_problem
from proxy.authoring.cases import CaseLookup
from proxy.authoring.explain import EXPLAIN_AGENT, Explanation, SampleRequest, admit, conclude
from proxy.gate.bodies import BodyRejected, parse_json_object
from proxy.gate.checks import Agent
from proxy.gate.ids import IdKind, id_rule, valid_id
from proxy.gate.intake import load_operation
from proxy.gate.preconditions import LookupAnswer
from proxy.gate.reasons import Reason
from proxy.policy.set import PolicySet
from proxy.runtime import GATEWAY
from proxy.store.store import Store


class ExplainAgent(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: Annotated[str, Field(min_length=1)]
    tenant: Annotated[str, Field(min_length=1)]


class ExplainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    method: Annotated[str, Field(min_length=1, max_length=16)]
    path: Annotated[str, Field(pattern=r"^/")]
    headers: dict[str, str] = Field(default_factory=dict)
    body: str = ""
    operation_id: str | None = None
    agent: ExplainAgent | None = None
    lookups: dict[str, CaseLookup] = Field(default_factory=dict)


async def explain_with_store(
    policy: PolicySet,
    store: Store,
    sample: SampleRequest,
    operation_id: str | None,
    agent: Agent | None,
    lookups: Mapping[str, LookupAnswer] | None = None,
) -> Explanation:
    """Explain ``sample``, reading its operation from the store as the pipeline does."""
    if operation_id is not None:
        sample = sample.with_header_default("X-Operation-Id", operation_id)
        if agent is None:
            named = await store.load(operation_id)
            if named is not None:
                agent = Agent(agent_id=named.agent_id or "explain", tenant=named.tenant)
    sample = SampleRequest(
        sample.method, sample.path, sample.headers, sample.body, agent or EXPLAIN_AGENT
    )
    front = admit(policy, sample)
    if isinstance(front, Explanation):
        return front
    op = await load_operation(store, front[0])
    return conclude(policy, front, op, lookups)


async def explain_request(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    try:
        # parsed as strictly as an agent's body first: pydantic's own JSON reader lets the
        # last of two duplicated keys win
        asked = ExplainRequest.model_validate(parse_json_object(await request.read()))
    except BodyRejected as exc:
        return admin_problem(400, "invalid_request", str(exc))
    except ValidationError as exc:
        errors = [
            f"{'.'.join(str(p) for p in e['loc']) or '(body)'}: {e['msg']}" for e in exc.errors()
        ]
        return admin_problem(
            400, "invalid_request", "the explain request is invalid", errors=errors
        )
    if asked.operation_id is not None and not valid_id(asked.operation_id, IdKind.OPERATION):
        return admin_problem(400, Reason.OPERATION_ID_INVALID.value, id_rule(IdKind.OPERATION))
    sample = SampleRequest(
        asked.method.upper(), asked.path, tuple(asked.headers.items()), asked.body.encode()
    )
    agent = Agent(agent_id=asked.agent.id, tenant=asked.agent.tenant) if asked.agent else None
    policy = gateway.policy  # one set for the whole explanation, as for a request
    lookups = {path: given.answer() for path, given in asked.lookups.items()}
    explanation = await explain_with_store(
        policy, gateway.store, sample, asked.operation_id, agent, lookups
    )
    return web.json_response(explanation.to_json())


def add_explain_routes(app: web.Application) -> None:
    app.router.add_post("/v1/explain", explain_request)
