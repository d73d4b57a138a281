"""``opgate audit witness``: a minimal C2SP tlog-witness, for a security team to run on its own
machine, with its own key, apart from opgate.

    POST /add-checkpoint           cosign a checkpoint consistent with the last one cosigned
    GET  /<sha256(origin)>/checkpoint   the last checkpoint cosigned for that log

It trusts the logs whose keys it is given (``--log VKEY``; several keys of one origin: a log
that rotated its key, each trusted, the state one per origin), keeps per log the last checkpoint
it cosigned in one JSON file (written and synced before it answers; one request decides at a
time, so two cannot both extend the same size), and refuses what the specification refuses
(proxy/transparency/witness.py decides). No database, no opgate settings.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from proxy.transparency import note
from proxy.transparency.witness import (
    Cosigned,
    Refusal,
    decide,
    origin_of,
    parse_add_checkpoint,
)

MAX_BODY = 64 * 1024


class WitnessState:
    """The last checkpoint cosigned per log origin, in a JSON file replaced atomically."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._logs: dict[str, dict[str, str | int]] = (
            json.loads(path.read_text("utf-8")) if path.is_file() else {}
        )

    def latest(self, origin: str) -> Cosigned | None:
        entry = self._logs.get(origin)
        if entry is None:
            return None
        return Cosigned(int(entry["size"]), base64.b64decode(str(entry["root"])))

    def checkpoint(self, origin: str) -> str | None:
        entry = self._logs.get(origin)
        return str(entry["checkpoint"]) if entry else None

    def keep(self, origin: str, size: int, root: bytes, checkpoint: str) -> None:
        logs = dict(self._logs)
        logs[origin] = {
            "size": size,
            "root": base64.b64encode(root).decode(),
            "checkpoint": checkpoint,
        }
        temporary = self._path.with_name(self._path.name + ".tmp")
        with temporary.open("w", encoding="utf-8") as handle:
            json.dump(logs, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self._path)
        self._logs = logs


def witness_app(
    signer: note.Signer, logs: Sequence[note.Verifier], state: WitnessState
) -> web.Application:
    trusted: dict[str, list[note.Verifier]] = {}
    for log in logs:  # a rotated log: its earlier keys and its new one, each given by --log
        trusted.setdefault(log.name, []).append(log)
    deciding = asyncio.Lock()  # check and keep, atomically (the specification's race)

    async def add_checkpoint(request: web.Request) -> web.Response:
        body = await request.read()  # over client_max_size: aiohttp answers 413
        try:
            submitted = parse_add_checkpoint(body)
            origin = origin_of(submitted.checkpoint)
            async with deciding:
                checkpoint = decide(submitted, trusted, state.latest(origin))
                cosignature = signer.sign(checkpoint.text(), timestamp=int(time.time()))
                parsed = note.parse_note(submitted.checkpoint)
                kept = note.Note(parsed.text, (*parsed.signatures, cosignature)).render()
                state.keep(origin, checkpoint.size, checkpoint.root, kept)
        except Refusal as refusal:
            return web.Response(
                status=refusal.status, text=refusal.reason, content_type=refusal.content_type
            )
        return web.Response(text=cosignature.line(), content_type="text/plain")

    async def latest_checkpoint(request: web.Request) -> web.Response:
        wanted = request.match_info["origin_hash"]
        for origin in trusted:
            if hashlib.sha256(origin.encode()).hexdigest() == wanted:
                kept = state.checkpoint(origin)
                if kept is not None:
                    return web.Response(text=kept, content_type="text/plain")
        raise web.HTTPNotFound(text="no checkpoint cosigned for that log")

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/add-checkpoint", add_checkpoint)
    app.router.add_get("/{origin_hash:[0-9a-f]{64}}/checkpoint", latest_checkpoint)
    return app
