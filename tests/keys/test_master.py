from __future__ import annotations

import pytest
from cryptography.exceptions import InvalidTag

from engine.keys import MasterKey
from engine.keys.master import AES, CHACHAPOLY, cipher_name


@pytest.mark.parametrize(("given", "canonical"), [("aes", AES), ("AES", AES), ("chacha", CHACHAPOLY),
                                                  ("ChaChaPoly", CHACHAPOLY), (None, CHACHAPOLY)])
def test_cipher_names_are_nats_servers(given: str | None, canonical: str) -> None:
    assert cipher_name(given) == canonical


def test_an_unknown_cipher_or_an_empty_key_is_refused() -> None:
    with pytest.raises(ValueError, match="Unknown cipher type"):
        MasterKey.from_config("k" * 32, "des")
    with pytest.raises(ValueError, match="empty"):
        MasterKey.from_config("")


def test_a_string_key_is_its_utf8_bytes_as_in_nats_server() -> None:
    text = "ключ-0123456789abcdef"
    assert MasterKey.from_config(text, "aes") == MasterKey.from_config(text.encode(), "aes")


def test_the_environment_gives_the_key_and_cipher() -> None:
    assert MasterKey.from_environment({}) is None
    master = MasterKey.from_environment({"JETLAKE_KEY": "e" * 32, "JETLAKE_CIPHER": "aes"})
    assert master == MasterKey(b"e" * 32, AES)


def test_the_secret_stays_out_of_repr() -> None:
    assert "s3cr3t" not in repr(MasterKey.from_config("s3cr3t" * 6))


@pytest.mark.parametrize("cipher", [AES, CHACHAPOLY])
def test_derived_keys_are_separate_per_account_salt_and_purpose(cipher: str) -> None:
    master = MasterKey.from_config("m" * 32, cipher)
    a = master.account_keys("A", b"s" * 16)
    b = master.account_keys("B", b"s" * 16)
    c = master.account_keys("A", b"t" * 16)
    again = master.account_keys("A", b"s" * 16)
    assert a.mac_key == again.mac_key and a.tag_key == again.tag_key
    assert len({a.mac_key, a.tag_key, b.mac_key, b.tag_key, c.mac_key, c.tag_key}) == 6
    blob = a.kek.wrap(b"data key", b"bound to this")
    assert again.kek.unwrap(blob, b"bound to this") == b"data key"
    for other, aad in ((b.kek, b"bound to this"), (c.kek, b"bound to this"), (a.kek, b"bound elsewhere")):
        with pytest.raises(InvalidTag):
            other.unwrap(blob, aad)


def test_the_wrapping_follows_the_cipher() -> None:
    aes = MasterKey.from_config("m" * 32, "aes").account_keys("A", b"s" * 16)
    chacha = MasterKey.from_config("m" * 32, "chachapoly").account_keys("A", b"s" * 16)
    blob = aes.kek.wrap(b"data key", b"")
    assert aes.kek.cipher == AES and chacha.kek.cipher == CHACHAPOLY
    with pytest.raises(InvalidTag):
        chacha.kek.unwrap(blob, b"")
