"""``subscriptions/listen`` (2026-07-28, SEP-2575): a client watches operations as resources
(``resourceSubscriptions``: ``opgate://operations/{id}``, answered with
``notifications/resources/updated``) and tasks (``taskIds``, the tasks extension's, answered
with ``notifications/tasks`` carrying the task as ``tasks/get`` answers it).

The stream is the listen request's own response (server-sent events on the otherwise
stateless endpoint), so it needs no session and works on any replica: the stream polls the
rows it watches in PostgreSQL (one statement per interval for all of them), and a change made
by any replica, the operations API, the console or recovery is seen alike. Only what is in
the agent's scope is watched; the acknowledgement names exactly that (another tenant's id is
left out, as an unknown one is). opgate's tools, prompts and resource list never change at run
time: those kinds are never honored. No replay: a dropped stream is listened again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from pydantic import ConfigDict

from proxy.mcp.calls import McpCall, watchable
from proxy.mcp.resources import SCHEME_PREFIX, operation_uri
from proxy.mcp.tasks import TASKS, negotiated

MAX_WATCHED = 100  # ids per stream: one statement reads them all each interval
WATCH_INTERVAL_SECONDS = 1.0

TaskOf = Callable[[ServerRequestContext[Any, Any], str], Awaitable[dict[str, Any] | None]]


class _TaskNotification(types.Notification[dict[str, Any], str]):
    """``notifications/tasks``: the extension's, not in the SDK's vocabulary."""

    model_config = ConfigDict(extra="forbid")


class Listening:
    """The ``subscriptions/listen`` handler. ``task_of``: a task as ``tasks/get`` answers it
    (None once it cannot be read); ``stopping``: set when the listener stops, which ends every
    stream gracefully."""

    def __init__(
        self,
        call_of: Callable[[ServerRequestContext[Any, Any]], McpCall],
        task_of: TaskOf,
        stopping: asyncio.Event,
    ) -> None:
        self.call_of, self.task_of, self.stopping = call_of, task_of, stopping

    async def __call__(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.SubscriptionsListenRequestParams,
    ) -> types.SubscriptionsListenResult:
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        requested = params.notifications
        uris = list(requested.resource_subscriptions or ())
        task_ids = (requested.model_extra or {}).get("taskIds") or []
        if not isinstance(task_ids, list) or not all(isinstance(i, str) for i in task_ids):
            raise MCPError(types.INVALID_PARAMS, "taskIds is a list of task ids")
        if task_ids and not negotiated(ctx):  # the extension's rule
            raise MCPError(
                -32021,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {TASKS: {}}}},
            )
        if len(uris) + len(task_ids) > MAX_WATCHED:
            raise MCPError(types.INVALID_PARAMS, f"at most {MAX_WATCHED} resources and tasks")
        call = self.call_of(ctx)
        named = [uri.removeprefix(SCHEME_PREFIX) for uri in uris if uri.startswith(SCHEME_PREFIX)]
        watched_operations, watched_tasks = await watchable(call, named, task_ids)
        honored = types.SubscriptionFilter.model_validate(
            {
                "resourceSubscriptions": [operation_uri(i) for i in watched_operations] or None,
                "taskIds": watched_tasks or None,
            }
        )
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        store = call.gateway.store
        versions = await store.watched_versions(watched_operations, [])
        # a task id names an operation or a proposal: read as both, each found where it is
        versions_of_tasks = await store.watched_versions(watched_tasks, watched_tasks)
        await ctx.session.send_notification(
            types.SubscriptionsAcknowledgedNotification(
                params=types.SubscriptionsAcknowledgedNotificationParams(
                    notifications=honored, _meta=meta
                )
            ),
            related_request_id=subscription_id,
        )
        while watched_operations or watched_tasks:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), WATCH_INTERVAL_SECONDS)
            if self.stopping.is_set():
                break
            now = await store.watched_versions(watched_operations, [])
            for operation_id in watched_operations:
                if now.get(operation_id) != versions.get(operation_id):
                    updated = types.ResourceUpdatedNotification(
                        params=types.ResourceUpdatedNotificationParams(
                            uri=operation_uri(operation_id), _meta=meta
                        )
                    )
                    await ctx.session.send_notification(updated, related_request_id=subscription_id)
            versions = now
            now = await store.watched_versions(watched_tasks, watched_tasks)
            for task_id in watched_tasks:
                if now.get(task_id) == versions_of_tasks.get(task_id):
                    continue
                task = await self.task_of(ctx, task_id)
                if task is None:  # not read this time (a limit, the store): next interval
                    continue
                versions_of_tasks[task_id] = now.get(task_id, "")
                task.pop("resultType", None)  # a notification carries the task alone
                told = _TaskNotification(
                    method="notifications/tasks", params={**task, "_meta": meta}
                )
                await ctx.session.send_notification(
                    told,  # type: ignore[arg-type]  # the extension's, not a core notification
                    related_request_id=subscription_id,
                )
        return types.SubscriptionsListenResult(_meta=meta)
