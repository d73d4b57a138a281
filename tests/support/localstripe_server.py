"""localstripe, a stateful fake of the Stripe API, served in-process for the whole test session,
and the worked example's fake Stripe (``./dev localstripe`` runs this module: README).

Why in-process: the ``localstripe`` CLI binds every interface and pickles its whole store to
the fixed path ``/tmp/localstripe.pickle`` on every write (and reloads it at start), so two
runs on one machine would share state through the disk. Here its aiohttp ``app`` is served
on a 127.0.0.1 port-0 socket by the session's event loop, with the disk persistence replaced
by no-ops: the store lives only in this process's memory.

localstripe ignores ``Idempotency-Key`` and does not stop over-refunds, so every request that
gets past opgate leaves a refund behind: :func:`list_refunds` reads that ground truth directly
(never through a proxy) and is what tests assert on.

Things worth knowing:

* The app and its store are module-level singletons in localstripe, so there is one
  localstripe per process: objects created by one test stay visible to the next. Tests must
  find their own objects by id (a fresh charge per test), never by counting everything.
* Calls through a synchronous client (the official ``stripe`` SDK) must run in a thread
  (``asyncio.to_thread``): the event loop that runs the test also serves localstripe.
* localstripe schedules webhook deliveries as fire-and-forget tasks that sleep first; the
  fixture tracks and cancels them at teardown so none is left pending on the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import warnings
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

with warnings.catch_warnings():
    # localstripe registers plain (non-async) handlers at import time; aiohttp attributes the
    # resulting DeprecationWarning to its own module, which pyproject's filter for
    # localstripe.* does not cover. This is the only warning silenced here.
    warnings.filterwarnings(
        "ignore", message="Bare functions are deprecated", category=DeprecationWarning
    )
    import localstripe.resources
    import localstripe.server
    import localstripe.webhooks

__all__ = [
    "LOCALSTRIPE_API_KEY",
    "create_charge",
    "create_payment_intent",
    "list_refunds",
    "localstripe_url",
]

#: Any ``sk_...`` key longer than five characters authenticates against localstripe.
LOCALSTRIPE_API_KEY = "sk_test_opgate_ground_truth"

_AUTH = {"Authorization": f"Bearer {LOCALSTRIPE_API_KEY}"}


def _no_disk(_store: object) -> None:
    """Stand in for localstripe's pickle load/dump, so nothing touches /tmp/localstripe.pickle."""


@contextlib.contextmanager
def _tracked_webhook_tasks() -> Iterator[set[asyncio.Task[None]]]:
    """Route localstripe's fire-and-forget webhook tasks into a set the fixture can cancel."""
    tasks: set[asyncio.Task[None]] = set()
    send: Callable[[Any], Coroutine[Any, Any, None]] = localstripe.webhooks._send_webhook

    def schedule_webhook(event: Any) -> None:
        task = asyncio.get_running_loop().create_task(send(event))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    with pytest.MonkeyPatch.context() as patch:
        # resources.py did `from .webhooks import schedule_webhook`: patch the name it calls.
        patch.setattr(localstripe.resources, "schedule_webhook", schedule_webhook)
        yield tasks


@contextlib.asynccontextmanager
async def serve_localstripe(port: int = 0) -> AsyncIterator[str]:
    """localstripe's app on 127.0.0.1:``port`` (0: any), its store in this process's memory
    only, until the block exits; yields its base URL, no trailing slash."""
    with (
        pytest.MonkeyPatch.context() as patch,
        _tracked_webhook_tasks() as webhook_tasks,
    ):
        patch.setattr(localstripe.resources.Store, "dump_to_disk", _no_disk)
        patch.setattr(localstripe.resources.Store, "try_load_from_disk", _no_disk)
        localstripe.resources.store.clear()

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart reuses its port
        sock.bind(("127.0.0.1", port))
        bound: int = sock.getsockname()[1]
        runner = web.AppRunner(localstripe.server.app, access_log=None, shutdown_timeout=5.0)
        await runner.setup()
        try:
            await web.SockSite(runner, sock).start()
            yield f"http://127.0.0.1:{bound}"
        finally:
            await runner.cleanup()
            sock.close()
            for task in list(webhook_tasks):
                task.cancel()
            await asyncio.gather(*webhook_tasks, return_exceptions=True)
            localstripe.resources.store.clear()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def localstripe_url() -> AsyncIterator[str]:
    """Serve localstripe on 127.0.0.1 for the session; yield its base URL, no trailing slash."""
    async with serve_localstripe() as url:
        yield url


async def _request(
    base_url: str,
    method: str,
    path: str,
    *,
    form: Mapping[str, str] | None = None,
    query: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Call localstripe directly and return its JSON; any non-2xx answer fails the test.

    A plain ``aiohttp.ClientSession`` ignores ``HTTP(S)_PROXY`` (``trust_env`` is off), so
    this never goes through opgate even when a test has set proxy variables.
    """
    async with (
        aiohttp.ClientSession(headers=_AUTH) as session,
        session.request(method, f"{base_url}{path}", data=form, params=query) as response,
    ):
        body: dict[str, Any] = await response.json()
        if response.status >= 300:
            raise AssertionError(f"localstripe {method} {path}: {response.status} {body}")
        return body


async def create_charge(base_url: str, amount: int, currency: str = "usd") -> str:
    """Create a succeeded card charge (``source=pm_card_visa``) and return its ``ch_...`` id."""
    charge = await _request(
        base_url,
        "POST",
        "/v1/charges",
        form={"amount": str(amount), "currency": currency, "source": "pm_card_visa"},
    )
    charge_id: str = charge["id"]
    return charge_id


async def create_payment_intent(base_url: str, amount: int, currency: str = "usd") -> str:
    """Create and confirm a card payment intent, so it can be refunded; return its ``pi_...`` id.

    localstripe does not take ``confirm=true`` on create, hence the second call.
    """
    intent = await _request(
        base_url,
        "POST",
        "/v1/payment_intents",
        form={"amount": str(amount), "currency": currency, "payment_method": "pm_card_visa"},
    )
    intent_id: str = intent["id"]
    confirmed = await _request(base_url, "POST", f"/v1/payment_intents/{intent_id}/confirm")
    if confirmed["status"] != "succeeded":
        raise AssertionError(f"localstripe left {intent_id} {confirmed['status']}")
    return intent_id


async def list_refunds(
    base_url: str, *, charge: str | None = None, payment_intent: str | None = None
) -> list[dict[str, Any]]:
    """Return every refund of one charge or payment intent, read straight from localstripe.

    This is the ground truth: each refund carries its ``metadata`` (for example
    ``metadata["operation_id"]``), which localstripe cannot filter on server side.
    """
    if (charge is None) == (payment_intent is None):
        raise TypeError("list_refunds needs exactly one of charge= or payment_intent=")
    query = {"limit": "100"}
    if charge is not None:
        query["charge"] = charge
    if payment_intent is not None:
        query["payment_intent"] = payment_intent
    page = await _request(base_url, "GET", "/v1/refunds", query=query)
    refunds: list[dict[str, Any]] = page["data"]
    if page.get("has_more"):
        raise AssertionError(f"more than 100 refunds for {query}; paginate")
    return refunds


async def list_payment_intents(base_url: str) -> list[dict[str, Any]]:
    """Return every payment intent localstripe holds (at most 100), read straight from it."""
    page = await _request(base_url, "GET", "/v1/payment_intents", query={"limit": "100"})
    intents: list[dict[str, Any]] = page["data"]
    if page.get("has_more"):
        raise AssertionError("more than 100 payment intents; paginate")
    return intents


async def _serve_until_stopped(port: int) -> None:
    async with serve_localstripe(port) as url:
        # the first line says where: the worked example's shell, and a test, read it
        print(
            f"localstripe: {url} (127.0.0.1 only; its state in memory, gone at exit)",
            file=sys.stderr,
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    """``./dev localstripe [--port 8420]``: the fake Stripe of the worked example, bound to
    127.0.0.1 (the localstripe command binds every interface) and keeping its state in memory
    (the command pickles it to, and loads it from, the shared /tmp/localstripe.pickle)."""
    parser = argparse.ArgumentParser(prog="./dev localstripe", description=main.__doc__)
    parser.add_argument("--port", type=int, default=8420, help="on 127.0.0.1 (0: any free port)")
    asyncio.run(_serve_until_stopped(parser.parse_args(argv).port))


if __name__ == "__main__":
    main()
