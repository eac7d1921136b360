"""NATS nkeys: public keys of operators, accounts and users, and the ed25519 signatures they check.

A public nkey is base32 (no padding) of one prefix byte (`O` operator, `A` account, `U` user), the
32-byte ed25519 key and a CRC-16 of both (little endian); 56 characters. Signing is done by clients
(PyPI `nkeys`); the server only verifies: the nonce a client signs at CONNECT and the signatures of
JWTs. Signatures travel as unpadded base64url (nats-server also accepts standard base64).
Counterpart: nats-io/nkeys (`Decode`, `FromPublicKey`, `Verify`) and server/auth.go's nonce check.
"""

from __future__ import annotations

import base64
import binascii

import nacl.exceptions
import nacl.signing
import nkeys

PREFIXES = {"O": nkeys.PREFIX_BYTE_OPERATOR, "A": nkeys.PREFIX_BYTE_ACCOUNT, "U": nkeys.PREFIX_BYTE_USER}
PUBLIC_KEY_LENGTH = 56


def decode_public(key: str, kind: str) -> bytes:
    """The raw ed25519 key of a public nkey of `kind` ("O", "A" or "U"); ValueError if it is not one."""
    if len(key) != PUBLIC_KEY_LENGTH or not key.startswith(kind):
        raise ValueError(f"not a public {kind} nkey")
    try:
        raw = base64.b32decode(key + "=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        raise ValueError("not a base32 nkey") from None
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if body[0] != PREFIXES[kind] or nkeys.crc16(bytearray(body)) != crc:
        raise ValueError("nkey checksum or prefix is wrong")
    return bytes(body[1:])


def is_public(key: object, kind: str) -> bool:
    if not isinstance(key, str):
        return False
    try:
        decode_public(key, kind)
    except ValueError:
        return False
    return True


def decode_signature(text: str) -> bytes:
    """A signature as a client sends it: unpadded base64url, or standard base64 (nats-server tries both)."""
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        pass
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("signature is not base64") from None


def verify(public_key: str, data: bytes, signature: bytes) -> bool:
    """Whether `signature` is the ed25519 signature of `data` by the holder of `public_key`."""
    try:
        raw = decode_public(public_key, public_key[:1]) if public_key[:1] in PREFIXES else None
    except ValueError:
        return False
    if raw is None or len(signature) != 64:
        return False
    try:
        nacl.signing.VerifyKey(raw).verify(data, signature)
    except nacl.exceptions.BadSignatureError:
        return False
    return True
