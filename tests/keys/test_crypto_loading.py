"""`cryptography` is loaded by the first use of a key, not by the gateway's imports: a warehouse without
`key` never maps its ~6 MB Rust module (engine/keys/crypto.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PLAIN_ENGINE = """
import sys, tempfile
import api.cli, api.http.app, api.nats.server, api.auth
from engine import EngineOptions, InboundMessage, JetStream
js = JetStream(tempfile.mkdtemp(prefix="jetlake-tests-crypto-"), EngineOptions())
js.add_stream({"name": "PLAIN", "subjects": ["plain.>"]})
js.publish([InboundMessage("plain.1", b"x")])
js.flush()
assert js.stream("PLAIN").index.msgs == 1
js.close()
print(sorted(m for m in sys.modules if m.split(".")[0] == "cryptography"))
"""

_KEYED_ENGINE = """
import sys, tempfile
from engine import EngineOptions, InboundMessage, JetStream
from engine.keys import MasterKey, crypto
assert "cryptography" not in sys.modules
js = JetStream(tempfile.mkdtemp(prefix="jetlake-tests-crypto-"), EngineOptions(key=MasterKey.from_config("s3cr3t-key-of-the-test-32-bytes!")))
js.add_stream({"name": "SEALED", "subjects": ["sealed.>"]})
js.publish([InboundMessage("sealed.1", b"secret")])
js.flush()
assert js.stream("SEALED").index.msgs == 1
js.close()
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
assert crypto.InvalidTag is InvalidTag and crypto.AESGCM is AESGCM
print("loaded" if "cryptography" in sys.modules else "missing")
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_a_gateway_without_keys_never_loads_cryptography() -> None:
    assert _run(_PLAIN_ENGINE) == "[]"


def test_a_key_loads_cryptography_at_its_first_use_and_the_names_are_its_own() -> None:
    assert _run(_KEYED_ENGINE) == "loaded"
