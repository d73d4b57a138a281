"""One HTTP/1.1 exchange over a raw socket, for bytes that client libraries refuse to send (a NUL
in a header, two Content-Length headers, a request line that is not HTTP)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from multidict import CIMultiDict

READ_SECONDS = 10.0  # a bound for a server that never closes, not a synchronisation


@dataclass(frozen=True)
class RawResponse:
    status: int
    headers: CIMultiDict[str]
    body: bytes

    def problem(self) -> dict[str, Any]:
        payload: dict[str, Any] = json.loads(self.body)
        return payload


async def exchange(base_url: str, request: bytes) -> RawResponse:
    """Send ``request`` as it is to ``base_url``'s host and port; read the answer until the
    server closes the connection (send ``Connection: close``, or bytes it refuses)."""
    address = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    try:
        writer.write(request)
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), READ_SECONDS)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in header_lines:
        name, _, value = line.partition(":")
        headers.add(name.strip(), value.strip())
    return RawResponse(int(status_line.split(" ")[1]), headers, body)


def request_bytes(
    method: str,
    target: str,
    headers: list[tuple[str, bytes | str]],
    body: bytes = b"",
    *,
    content_length: bool = True,
) -> bytes:
    """A request head (with ``Connection: close``) and body; header values may be raw bytes."""
    lines = [f"{method} {target} HTTP/1.1".encode(), b"Host: opgate.test", b"Connection: close"]
    for name, value in headers:
        lines.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode())
        )
    if content_length:
        lines.append(f"Content-Length: {len(body)}".encode())
    return b"\r\n".join(lines) + b"\r\n\r\n" + body
