"""opgate's own certificate authority, for TLS interception of inspected hosts.

``opgate ca init`` (or the first start of the forward listener) creates it in ``ca_dir``:
``opgate-ca.pem`` is the certificate agents trust (``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``);
``opgate-ca-key.pem`` is its key. Leaf certificates are issued on the fly per host, cached in
memory for the process, and their keys written under ``ca_dir/leaves`` because ``ssl`` loads
keys from files only. Every key file is created 0600 in a 0700 directory: keys never leave
opgate's data directory.

Keys are ECDSA P-256: issuing a leaf takes about a millisecond, an RSA key hundreds.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from proxy.errors import ConfigurationError

CA_CERT_FILE = "opgate-ca.pem"
CA_KEY_FILE = "opgate-ca-key.pem"
LEAF_DIR = "leaves"
CA_LIFETIME = datetime.timedelta(days=3650)
LEAF_LIFETIME = datetime.timedelta(days=30)
# Leaves are re-issued this long before they expire (a process may run for weeks).
LEAF_RENEW_BEFORE = datetime.timedelta(days=7)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate clients whose clock is a little behind


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as 0600, atomically (no reader sees half a key)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def init_ca(ca_dir: Path, *, common_name: str = "opgate interception CA") -> bool:
    """Create the CA in ``ca_dir`` unless one is there; True when a new one was created."""
    _private_dir(ca_dir)
    cert_path, key_path = ca_dir / CA_CERT_FILE, ca_dir / CA_KEY_FILE
    if cert_path.exists() or key_path.exists():
        if not (cert_path.exists() and key_path.exists()):
            raise ConfigurationError(f"{ca_dir} holds half a CA (certificate or key missing)")
        return False
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, _key_pem(key))  # the key first: a certificate alone is useless
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    cert_path.chmod(0o644)  # the certificate is public: agents are given it
    return True


# The TLS server name each handshake asked for. It cannot be read back from an SSLObject once
# the handshake is done, so the SNI callback records it here (weak: gone with the connection).
_SERVER_NAMES: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def _record_server_name(
    ssl_object: ssl.SSLObject | ssl.SSLSocket, name: str | None, _context: ssl.SSLContext
) -> None:
    if name is not None:
        _SERVER_NAMES[ssl_object] = name.lower()


def requested_server_name(ssl_object: object) -> str | None:
    """The SNI name the client sent in this connection's handshake, if any."""
    return _SERVER_NAMES.get(ssl_object)


@dataclass
class _Leaf:
    context: ssl.SSLContext
    not_after: datetime.datetime


class CertificateAuthority:
    """The loaded CA; ``server_context(host)`` is a TLS server context with a leaf for host."""

    def __init__(self, ca_dir: Path) -> None:
        self.ca_dir = ca_dir
        self.cert_path = ca_dir / CA_CERT_FILE
        try:
            self._cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
            key = serialization.load_pem_private_key(
                (ca_dir / CA_KEY_FILE).read_bytes(), password=None
            )
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"cannot load the CA in {ca_dir}: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigurationError(f"the CA key in {ca_dir} is not an ECDSA key")
        self._key = key
        self._leaves: dict[str, _Leaf] = {}
        self._lock = threading.Lock()
        _private_dir(ca_dir / LEAF_DIR)

    @classmethod
    def load_or_create(cls, ca_dir: Path) -> CertificateAuthority:
        init_ca(ca_dir)
        return cls(ca_dir)

    def server_context(self, host: str) -> ssl.SSLContext:
        """A cached server context presenting a leaf for ``host`` (a name or an IP literal)."""
        host = host.lower()
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:  # issuing runs in worker threads; one leaf per host
            leaf = self._leaves.get(host)
            if leaf is None or leaf.not_after - now < LEAF_RENEW_BEFORE:
                leaf = self._issue(host, now)
                self._leaves[host] = leaf
            return leaf.context

    def _issue(self, host: str, now: datetime.datetime) -> _Leaf:
        key = ec.generate_private_key(ec.SECP256R1())
        public = key.public_key()
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        not_after = min(now + LEAF_LIFETIME, self._cert.not_valid_after_utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        path = self.ca_dir / LEAF_DIR / f"{host.replace(':', '_')}.pem"
        _write_private(
            path,
            _key_pem(key)
            + cert.public_bytes(serialization.Encoding.PEM)
            + self._cert.public_bytes(serialization.Encoding.PEM),
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # aiohttp's server speaks HTTP/1.1 only; curl would otherwise pick h2.
        context.set_alpn_protocols(["http/1.1"])
        context.sni_callback = _record_server_name
        context.load_cert_chain(path)
        return _Leaf(context, not_after)
