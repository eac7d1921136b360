"""TLS for the HTTP door: the server's certificate, optional client certificates, and the client's identity.

uvicorn terminates TLS but does not put the peer certificate in the ASGI scope. `IdentityProtocol`
(uvicorn's httptools protocol, one method wider) reads the verified client certificate once per
connection, when the handshake is done, and adds ASGI's `tls` extension to each request's scope
(`client_cert_chain`, `client_cert_name`) with the identity `verify_and_map` matches users against
(api/auth.py `CertIdentity`). Counterpart: server/opts.go `parseTLS`, `GenTLSConfig`.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from api.auth import CertIdentity
from api.http.gate import TLS_IDENTITY
from engine.accounts.config import TlsConfig


@dataclass(frozen=True)
class TlsSettings:
    """What uvicorn needs: the server's certificate and key, and how client certificates are asked for."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify: bool = False  # require a client certificate signed by `ca_file`
    verify_and_map: bool = False  # the client certificate names the user

    @property
    def cert_reqs(self) -> int:
        if self.verify:
            return ssl.CERT_REQUIRED
        return ssl.CERT_OPTIONAL if self.ca_file else ssl.CERT_NONE

    def uvicorn_options(self) -> dict[str, Any]:
        return {
            "ssl_certfile": self.cert_file,
            "ssl_keyfile": self.key_file,
            "ssl_ca_certs": self.ca_file,
            "ssl_cert_reqs": self.cert_reqs,
            "http": IdentityProtocol,
        }


def settings(config: TlsConfig | None, cert: str | None, key: str | None, ca: str | None, verify: bool, map_users: bool) -> TlsSettings | None:
    """The command line's `--tls-*` flags over the config's `tls {}` block; None: plain HTTP.

    Raises ValueError for an incomplete combination (a key without a certificate, verification
    without a CA)."""
    config = config or TlsConfig()
    cert, key, ca = cert or config.cert_file, key or config.key_file, ca or config.ca_file
    map_users = map_users or config.verify_and_map
    verify = verify or config.verify or map_users
    if cert is None and key is None:
        if ca or verify:
            raise ValueError("client certificates need TLS: give --tls-cert and --tls-key (or tls { cert_file, key_file })")
        return None
    if cert is None or key is None:
        raise ValueError("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    if verify and ca is None:
        raise ValueError("verifying client certificates needs the CA that signs them (--tls-ca or tls { ca_file })")
    return TlsSettings(cert, key, ca, verify, map_users)


class IdentityProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with the verified client certificate in every request's scope."""

    _tls: dict[str, Any] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        self._tls = _tls_extension(ssl_object) if ssl_object is not None else None

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._tls is not None:
            self.scope["extensions"] = {"tls": self._tls}  # type: ignore[typeddict-unknown-key]


def _tls_extension(ssl_object: ssl.SSLObject) -> dict[str, Any]:
    """ASGI's TLS extension; the certificate is only read when the handshake verified it."""
    peer = ssl_object.getpeercert()
    der = ssl_object.getpeercert(binary_form=True)
    out: dict[str, Any] = {"server_cert": None, "client_cert_chain": [], "client_cert_name": None, "client_cert_error": None}
    if peer and der:
        identity = CertIdentity.from_peercert(peer)
        out["client_cert_chain"] = [ssl.DER_cert_to_PEM_cert(der)]
        out["client_cert_name"] = identity.rfc4514()
        out[TLS_IDENTITY] = identity
    return out
