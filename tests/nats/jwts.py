"""Issuing nkeys, JWTs and `.creds` files for tests, as `nsc` does: real ed25519 keys (PyPI nkeys).

A JWT is signed by its issuer's seed over `header.payload`; a `.creds` file holds the user JWT and
the user's seed between nats-server's decoration lines.
"""

from __future__ import annotations

import base64
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
import orjson

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
PREFIX = {"O": nkeys.PREFIX_BYTE_OPERATOR, "A": nkeys.PREFIX_BYTE_ACCOUNT, "U": nkeys.PREFIX_BYTE_USER}


@dataclass(frozen=True)
class Key:
    seed: bytes
    public: str

    @classmethod
    def new(cls, kind: str) -> Key:
        seed = nkeys.encode_seed(os.urandom(32), PREFIX[kind])
        return cls(seed, nkeys.from_seed(bytearray(seed)).public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return nkeys.from_seed(bytearray(self.seed)).sign(data)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def issue(subject: str, issuer: Key, kind: str, nats: dict[str, Any], name: str = "", **claims: Any) -> str:
    payload = {
        "jti": secrets.token_hex(16), "iat": int(time.time()), "iss": issuer.public, "name": name or subject,
        "sub": subject, **claims, "nats": {**nats, "type": kind, "version": 2},
    }
    signing_input = f"{_b64(orjson.dumps(HEADER))}.{_b64(orjson.dumps(payload))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def creds(path: Path, user_jwt: str, user: Key) -> Path:
    path.write_text(
        "-----BEGIN NATS USER JWT-----\n" + user_jwt + "\n------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n\n"
        "-----BEGIN USER NKEY SEED-----\n" + user.seed.decode() + "\n------END USER NKEY SEED------\n"
    )
    return path


JETSTREAM_LIMITS = {
    "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True, "conn": -1, "leaf": -1,
    "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
}  # fmt: skip
NO_JETSTREAM_LIMITS = {k: v for k, v in JETSTREAM_LIMITS.items() if k not in ("mem_storage", "disk_storage", "streams", "consumer")}
