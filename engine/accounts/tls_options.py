"""The `tls {}` block of a nats-server config file: what JetLake's listeners need of it.

nats-server's TLS settings JetLake has no use for are accepted with a warning. Counterpart:
server/opts.go (parseTLS).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.accounts.syntax import Token
from engine.accounts.values import Reader

_IGNORED_TLS = frozenset(
    "insecure verify_cert_and_check_known_urls allow_insecure_cipher_suites cipher_suites curve_preferences "
    "timeout connection_rate_limit pinned_certs cert_store cert_match_by cert_match ca_certs_match "
    "handshake_first first immediate cert_match_skip_invalid ocsp_peer certs certificates".split()
)


@dataclass(frozen=True)
class TlsConfig:
    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    verify: bool = False
    verify_and_map: bool = False
    min_version: str | None = None


def read_tls(r: Reader, token: Token) -> TlsConfig:
    kept: dict[str, object] = {}
    for key, item in r.entries(token, "tls"):
        if key in ("cert_file", "key_file", "ca_file", "min_version"):
            kept[key] = r.string(item, key)
        elif key in ("verify", "verify_and_map"):
            kept[key] = r.boolean(item, key)
        elif key in _IGNORED_TLS:
            r.ignored(item, key)
        else:
            r.unknown(item, key, "parsing tls")
    tls = TlsConfig(**kept)  # type: ignore[arg-type]
    if (tls.cert_file is None) != (tls.key_file is None):
        r.error(token, "missing 'cert_file' or 'key_file' in TLS configuration")
    if tls.min_version is not None and tls.min_version not in ("1.2", "1.3"):
        r.error(token, f"unsupported TLS version {tls.min_version!r}: 1.2 or 1.3")
    if tls.verify_and_map:
        tls = TlsConfig(tls.cert_file, tls.key_file, tls.ca_file, True, True, tls.min_version)
    return tls
