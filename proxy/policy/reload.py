"""Hot reload of the policy set: on SIGHUP and when the files change, never half-way.

A candidate set is read once (each file's text), loaded and linted completely; only a set
without a single error replaces the holder's ``policy`` (the process's ``Gateway``), in one
assignment. Requests in flight keep the set they captured when they started
(``pipeline.handle_agent_request``). A refused set changes nothing: the old one keeps serving,
and the refusal is logged with every error.

Change detection polls a digest of the policy files' contents every
``policy_reload_interval_seconds`` (0: only SIGHUP). Polling, not inotify (watchfiles): it
works on every filesystem, including the network and container mounts policies are deployed
on, costs a few small reads, and needs no dependency. An editor that writes a file in several
steps may produce an invalid intermediate set: it is refused, and the next poll loads the
finished one.

Log events (structlog, logger ``opgate.policy``): ``policy_reloaded`` (old and new version,
trigger) and ``policy_reload_refused`` (candidate version, trigger, errors).
Both are also audit records in PostgreSQL (``policy`` stream). A reload is on record before
the new set decides anything: if the record cannot be written, the swap does not happen and
the next poll (or SIGHUP) tries again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from proxy.errors import StoreUnavailable
from proxy.policy.lint import errors, lint_policy_texts
from proxy.policy.load import (
    PolicyLoadError,
    build_policy_set,
    policy_version,
    read_policy_texts,
)
from proxy.policy.set import PolicySet

_log = structlog.get_logger("opgate.policy")


def load_validated_policy(directory: Path) -> PolicySet:
    """The set in ``directory`` if it has no error at all (load and lint); else PolicyLoadError."""
    texts = read_policy_texts(directory)
    return validated_policy(texts, str(directory))


def validated_policy(texts: list[tuple[Path, str]], directory: str) -> PolicySet:
    policy = build_policy_set(texts, directory)  # raises with every load problem
    lint_errors = errors(lint_policy_texts(texts))
    if lint_errors:
        raise PolicyLoadError([finding.as_problem() for finding in lint_errors])
    return policy


class PolicyEventRecorder(Protocol):
    async def record_policy_event(
        self,
        event: str,
        policy: PolicySet | None,
        *,
        now_deciding: bool,
        version: str | None = None,
        **fields: Any,
    ) -> None: ...


class PolicyHolder(Protocol):
    """What a reload swaps the set in (the process's ``Gateway``), and where it records it."""

    policy: PolicySet

    @property
    def observability(self) -> PolicyEventRecorder | None: ...


@dataclass
class ReloadOutcome:
    trigger: str
    version: str | None  # the candidate's digest
    reloaded: bool
    problems: list[str]


class PolicyReloader:
    """Swaps ``gateway.policy`` for a new valid set; one reload at a time."""

    def __init__(self, gateway: PolicyHolder, directory: Path) -> None:
        self._gateway = gateway
        self._directory = directory
        self._lock = asyncio.Lock()
        self._seen_version: str | None = gateway.policy.version
        self.refused: list[ReloadOutcome] = []  # refusals since start, for operators and tests

    async def reload(self, trigger: str) -> ReloadOutcome:
        """Read, validate and, if valid and new, swap. Never raises for a bad set."""
        async with self._lock:
            try:
                texts = await asyncio.to_thread(read_policy_texts, self._directory)
            except OSError as exc:
                return await self._refuse(trigger, None, [f"{self._directory}: {exc}"])
            version = policy_version(texts)
            self._seen_version = version
            current = self._gateway.policy
            if version == current.version:
                return ReloadOutcome(trigger, version, False, [])
            try:
                policy = validated_policy(texts, str(self._directory))
            except PolicyLoadError as exc:
                return await self._refuse(trigger, version, [str(p) for p in exc.problems])
            observability = self._gateway.observability
            if observability is not None:
                try:
                    await observability.record_policy_event(
                        "policy_reloaded",
                        policy,
                        now_deciding=True,
                        trigger=trigger,
                        old_policy_version=current.version,
                    )
                except StoreUnavailable as exc:
                    self._seen_version = None  # try again on the next poll
                    _log.error("policy_reload_deferred", trigger=trigger, error=str(exc))
                    return ReloadOutcome(trigger, version, False, [f"audit: {exc}"])
            self._gateway.policy = policy  # the swap: one assignment, the set is complete
            _log.info(
                "policy_reloaded",
                trigger=trigger,
                old_policy_version=current.version,
                policy_version=policy.version,
                providers=[p.provider for p in policy.providers],
            )
            return ReloadOutcome(trigger, version, True, [])

    def request_reload(self, trigger: str = "sighup") -> None:
        """For a signal handler: start a reload without waiting for it."""
        task = asyncio.get_running_loop().create_task(self.reload(trigger))
        _background.add(task)
        task.add_done_callback(_background.discard)

    async def watch(self, interval_seconds: float) -> None:
        """Poll the files' digest; reload when it differs from the last one seen."""
        while True:
            await asyncio.sleep(interval_seconds)  # the poll period, not a synchronisation
            try:
                texts = await asyncio.to_thread(read_policy_texts, self._directory)
            except OSError as exc:
                _log.warning("policy_watch_failed", error=str(exc))
                continue
            if policy_version(texts) != self._seen_version:
                await self.reload("file_change")

    async def _refuse(
        self, trigger: str, version: str | None, problems: list[str]
    ) -> ReloadOutcome:
        outcome = ReloadOutcome(trigger, version, False, problems)
        observability = self._gateway.observability
        if observability is not None:
            with contextlib.suppress(StoreUnavailable):  # the log line below still has it
                await observability.record_policy_event(
                    "policy_reload_refused",
                    None,
                    now_deciding=False,
                    version=version,
                    trigger=trigger,
                    errors=problems,
                )
        _log.error(
            "policy_reload_refused",
            trigger=trigger,
            candidate_policy_version=version,
            policy_version=self._gateway.policy.version,  # the set that keeps serving
            errors=problems,
        )
        # Listed once recorded and said: whoever watches the list (an operator, a test) then
        # finds the refusal in the audit log and the log stream too.
        self.refused.append(outcome)
        return outcome


_background: set[asyncio.Task[ReloadOutcome]] = set()


@contextlib.asynccontextmanager
async def reloading(
    gateway: PolicyHolder, directory: Path, interval_seconds: float
) -> AsyncIterator[PolicyReloader]:
    """A reloader for the block, polling the files unless ``interval_seconds`` is 0."""
    reloader = PolicyReloader(gateway, directory)
    watcher = (
        asyncio.get_running_loop().create_task(reloader.watch(interval_seconds))
        if interval_seconds > 0
        else None
    )
    try:
        yield reloader
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
