"""The master key: nats-server's `jetstream { key, cipher }`, and the keys derived from it per account.

A master key never touches the warehouse. From it and a random salt kept in the account's keyring,
HKDF-SHA256 (RFC 5869; `cryptography`'s HKDF) derives three independent keys per account:
- the key-encryption key (KEK), which wraps every data key with the AEAD `cipher` names:
  `"aes"` = AES-256-GCM, `"chachapoly"` (or `"chacha"`, nats-server's default) = ChaCha20-Poly1305;
- the MAC key, which authenticates every record of the account's keyring files;
- the tag key, which turns a subject prefix into the opaque tag that finds its data key, so no
  subject is ever written in clear in a keyring.

Why HKDF and not a password hash (scrypt, Argon2): nats-server treats `key` as key material and
derives its KEKs with a bare HMAC-SHA256 (jetstream.go `jsKeyGen`); HKDF is the standard
extract-then-expand construction for exactly that, and its `info` separates accounts and purposes,
so one server key yields unrelated keys per account. A password hash would only help a weak key, and
would cost every start, job and `jetlake sql` a deliberate 100 ms or more per account. The key must
therefore be strong: 32 random bytes, e.g. `openssl rand -base64 32`; a short key is logged.

Counterpart: server/jetstream.go (`jsKeyGen`, the `cipher` option of server/opts.go).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.keys import crypto

log = logging.getLogger(__name__)

AES = "aes"
CHACHAPOLY = "chachapoly"
_CIPHER_NAMES = {"aes": AES, "chacha": CHACHAPOLY, "chachapoly": CHACHAPOLY}
DEFAULT_CIPHER = CHACHAPOLY  # nats-server's default when `cipher` is not given
KEY_ENV = "JETLAKE_KEY"
CIPHER_ENV = "JETLAKE_CIPHER"
SHORT_KEY = 16
NONCE_SIZE = 12
_INFO = b"jetlake/keyring/v1/"


def cipher_name(name: str | None) -> str:
    """The canonical name of nats-server's `cipher` value; raises ValueError for an unknown one."""
    if name is None:
        return DEFAULT_CIPHER
    canonical = _CIPHER_NAMES.get(name.lower())
    if canonical is None:
        raise ValueError(f"Unknown cipher type: {name!r} (expected 'aes' or 'chachapoly')")
    return canonical


@dataclass(frozen=True)
class MasterKey:
    """A master key and the AEAD that wraps data keys with it."""

    secret: bytes = field(repr=False)
    cipher: str = DEFAULT_CIPHER

    @classmethod
    def from_config(cls, key: str | bytes, cipher: str | None = None) -> MasterKey:
        """The `key` (a string, as in nats-server's config, or raw bytes) and `cipher` of a `jetstream {}` block.

        Raises:
            ValueError: an empty key or an unknown cipher.
        """
        secret = key.encode() if isinstance(key, str) else bytes(key)
        if not secret:
            raise ValueError("the encryption key is empty")
        if len(secret) < SHORT_KEY:
            log.warning("the encryption key has %d bytes; use 32 random bytes (openssl rand -base64 32)", len(secret))
        return cls(secret, cipher_name(cipher))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] = os.environ) -> MasterKey | None:
        """The master key in `$JETLAKE_KEY` (and `$JETLAKE_CIPHER`), or None when it is not set."""
        key = environ.get(KEY_ENV)
        return None if key is None else cls.from_config(key, environ.get(CIPHER_ENV))

    def account_keys(self, account: str, salt: bytes) -> AccountKeys:
        """The keys of one account's keyring: derived, never stored."""
        return AccountKeys(
            kek=Wrapper(self.cipher, _derive(self.secret, salt, b"kek", account)),
            mac_key=_derive(self.secret, salt, b"mac", account),
            tag_key=_derive(self.secret, salt, b"tag", account),
        )


@dataclass(frozen=True)
class AccountKeys:
    kek: Wrapper
    mac_key: bytes = field(repr=False)
    tag_key: bytes = field(repr=False)


class Wrapper:
    """An AEAD under one key with random 96-bit nonces, laid out `nonce ‖ ciphertext ‖ tag`.

    Random nonces are safe here: a KEK wraps one blob per data key, far below the 2^32 messages per key
    that NIST SP 800-38D allows random 96-bit nonces.
    """

    def __init__(self, cipher: str, key: bytes) -> None:
        self.cipher = cipher
        self._aead = crypto.AESGCM(key) if cipher == AES else crypto.ChaCha20Poly1305(key)

    def wrap(self, plaintext: bytes, aad: bytes) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return nonce + self._aead.encrypt(nonce, plaintext, aad)

    def unwrap(self, blob: bytes, aad: bytes) -> bytes:
        """Raises cryptography's InvalidTag when the blob or its associated data was changed."""
        return self._aead.decrypt(blob[:NONCE_SIZE], blob[NONCE_SIZE:], aad)


def _derive(secret: bytes, salt: bytes, purpose: bytes, account: str) -> bytes:
    info = _INFO + purpose + b"\x00" + account.encode()
    return crypto.HKDF(algorithm=crypto.hashes.SHA256(), length=32, salt=salt, info=info).derive(secret)
