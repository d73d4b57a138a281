"""The SDK's low-level server, with the capabilities opgate can keep: the same on both eras
(the ``initialize`` handshake and 2026-07-28's ``server/discover``) and over stdio.

The SDK derives a 2026-07-28 server's ``listChanged`` flags from whether it serves
``subscriptions/listen``, as if every listen stream would carry list changes. opgate's streams
carry operation and task changes only: its tools, resource templates and (absent) prompts
never change while it runs, so it never sends a list change, and says so on every era
(``listChanged: false``). ``resources.subscribe`` stays as the SDK derives it per era: true
where ``subscriptions/listen`` watches operations (2026-07-28 over HTTP), false where nothing
could notify (the handshake era, which has no ``resources/subscribe`` here, and the stdio
relay).
"""

from __future__ import annotations

from typing import Any

import mcp.types as types
from mcp.server.lowlevel import NotificationOptions, Server


class OpgateServer(Server[Any]):
    def get_capabilities(
        self,
        notification_options: NotificationOptions | None = None,
        experimental_capabilities: dict[str, dict[str, Any]] | None = None,
        extensions: dict[str, dict[str, Any]] | None = None,
        *,
        protocol_version: str | None = None,
    ) -> types.ServerCapabilities:
        told = super().get_capabilities(
            NotificationOptions(),  # no list ever changes, whatever a caller asks to say
            experimental_capabilities,
            extensions,
            protocol_version=protocol_version,
        )
        unchanging: dict[str, Any] = {}
        for kind in ("tools", "resources", "prompts"):
            capability = getattr(told, kind)
            if capability is not None:
                unchanging[kind] = capability.model_copy(update={"list_changed": False})
        return told.model_copy(update=unchanging)
