"""The `cryptography` names encryption at rest uses, imported at their first use.

`cryptography`'s Rust module maps ~6 MB into a process that imports it, and a gateway whose
warehouse has no `key` never encrypts: engine/keys imports this module instead of `cryptography`, and
`crypto.AESGCM`, `crypto.InvalidTag`... load the library when a key is first used (or an
`except crypto.InvalidTag:` first matches an exception). The hot paths keep the cipher objects they
made, so they pay nothing per message.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["AESGCM", "HKDF", "ChaCha20Poly1305", "InvalidTag", "hashes"]

_HOMES = {
    "InvalidTag": "cryptography.exceptions",
    "AESGCM": "cryptography.hazmat.primitives.ciphers.aead",
    "ChaCha20Poly1305": "cryptography.hazmat.primitives.ciphers.aead",
    "HKDF": "cryptography.hazmat.primitives.kdf.hkdf",
}


def __getattr__(name: str) -> Any:
    if name == "hashes":
        value: Any = importlib.import_module("cryptography.hazmat.primitives.hashes")
    elif name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next access is a plain module attribute
    return value
