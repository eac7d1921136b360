"""Which master key an account gets: its own `jetstream { key, cipher }`, else the server's, else $JETLAKE_KEY."""

from __future__ import annotations

import pytest

from engine.accounts.config import ConfigError, loads
from engine.encryption import master_keys

CONFIG = """
jetstream { key: "server-key-0123456789abcdefghijkl", prev_key: "old-server-key-0123456789abcdef", cipher: aes }
accounts {
  OWN { jetstream { key: "own-key-0123456789abcdefghijklmn", cipher: chachapoly, max_streams: 5 } }
  SERVER { jetstream: enabled }
}
"""


def test_an_account_key_wins_over_the_server_key() -> None:
    config = loads(CONFIG)
    own, previous = master_keys(config.jetstream, config.accounts["OWN"], environ={})
    assert own is not None and own.secret == b"own-key-0123456789abcdefghijklmn" and own.cipher == "chachapoly"
    assert previous is None and config.accounts["OWN"].jetstream is not None
    assert config.accounts["OWN"].jetstream.max_streams == 5
    server, previous = master_keys(config.jetstream, config.accounts["SERVER"], environ={})
    assert server is not None and server.secret.startswith(b"server-key") and server.cipher == "aes"
    assert previous is not None and previous.secret.startswith(b"old-server-key")
    assert "own-key" not in repr(config)


def test_the_environment_when_the_config_has_no_key() -> None:
    config = loads("accounts { A { jetstream: enabled } }")
    key, _ = master_keys(config.jetstream, config.accounts["A"], environ={"JETLAKE_KEY": "env-key-0123456789abcdefghijklmn"})
    assert key is not None and key.secret.startswith(b"env-key")
    assert master_keys(config.jetstream, config.accounts["A"], environ={}) == (None, None)


def test_an_unknown_cipher_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Unknown cipher type"):
        loads('accounts { A { jetstream { key: "k", cipher: rot13 } } }')
