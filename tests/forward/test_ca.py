"""opgate's interception CA: created once, keys 0600, leaves that verify as the host."""

from __future__ import annotations

import asyncio
import ssl
import stat
from pathlib import Path

from proxy.forward.ca import CA_CERT_FILE, CA_KEY_FILE, LEAF_DIR, CertificateAuthority, init_ca


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_creates_once_with_private_keys(tmp_path: Path) -> None:
    """The CA key is 0600 in a 0700 directory; a second init keeps the existing CA."""
    ca_dir = tmp_path / "ca"
    assert init_ca(ca_dir) is True
    first = (ca_dir / CA_CERT_FILE).read_bytes()
    assert init_ca(ca_dir) is False
    assert (ca_dir / CA_CERT_FILE).read_bytes() == first
    assert mode(ca_dir) == 0o700
    assert mode(ca_dir / CA_KEY_FILE) == 0o600


def test_leaves_are_cached_and_their_keys_stay_private(tmp_path: Path) -> None:
    """One leaf per host, issued once per process, its key file 0600 under the CA directory."""
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    assert ca.server_context("provider.test") is ca.server_context("PROVIDER.test")
    [leaf] = (tmp_path / "ca" / LEAF_DIR).iterdir()
    assert mode(leaf) == 0o600
    assert mode(tmp_path / "ca" / LEAF_DIR) == 0o700


async def _handshake(ca: CertificateAuthority, host: str, cafile: Path) -> str | None:
    server = await asyncio.start_server(
        lambda r, w: w.close(), "127.0.0.1", 0, ssl=ca.server_context(host)
    )
    port = server.sockets[0].getsockname()[1]
    try:
        client = ssl.create_default_context(cafile=str(cafile))
        client.set_alpn_protocols(["h2", "http/1.1"])  # as curl offers
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=host
        )
        alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        writer.close()
        return alpn
    finally:
        server.close()
        await server.wait_closed()


async def test_a_leaf_verifies_for_its_name_and_ip(tmp_path: Path) -> None:
    """A client trusting only opgate's CA verifies leaves for a name and for an IP literal
    (strict default verification: hostname, chain, key usage); ALPN is http/1.1."""
    ca = CertificateAuthority.load_or_create(tmp_path / "ca")
    cafile = tmp_path / "ca" / CA_CERT_FILE
    assert await _handshake(ca, "provider.test", cafile) == "http/1.1"
    assert await _handshake(ca, "127.0.0.1", cafile) == "http/1.1"
