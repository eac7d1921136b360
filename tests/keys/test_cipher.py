from __future__ import annotations

import os
import select
import signal

import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from engine.keys import Keyring, KeyDestroyedError, ValueAuthenticationError, sql_decrypt
from engine.keys.cipher import HEADER_SIZE, OVERHEAD, PREFIX_SIZE, VERSION, associated_data, open_value
from engine.keys.nonces import NonceSource
from tests.keys.conftest import new_stream_id

SUBJECTS = ["orders.eu", "orders.us", "orders.eu"]


def _raw_key(stream, key_id: int) -> bytes:
    refs = dict(stream.sql_keys())
    return refs[bytes([VERSION]) + key_id.to_bytes(4, "big")]


def test_a_batch_seals_into_one_arrow_array_and_opens_back(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    payloads = [b"first", b"", b"x" * 5000]
    for given in (payloads, pa.array(payloads, pa.binary()), pa.array([b"pad", *payloads], pa.binary()).slice(1)):
        sealed = stream.seal_batch("data", [1, 2, 3], SUBJECTS, given)
        assert isinstance(sealed, pa.BinaryArray) and len(sealed) == 3
        assert [len(v) for v in sealed.to_pylist()] == [len(p) + OVERHEAD for p in payloads]
        opened = stream.open_batch("data", [1, 2, 3], SUBJECTS, sealed)
        assert opened.values == payloads and not opened.errors


def test_null_payloads_stay_null(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    sealed = stream.seal_batch("headers", [1, 2, 3], SUBJECTS, [None, b'{"A":["1"]}', None])
    assert sealed.null_count == 2 and sealed[1].is_valid
    assert stream.open_batch("headers", [1, 2, 3], SUBJECTS, sealed).values == [None, b'{"A":["1"]}', None]


def test_the_layout_is_header_then_sparks_iv_ciphertext_tag(ring: Keyring) -> None:
    """Checked with the bare AEAD, not with the module: byte 0 version, bytes 1-4 key id, then
    IV (12) ‖ ciphertext ‖ tag (16), the associated data `<stream id>:<seq>:<field>:<subject>`."""
    stream = ring.stream(new_stream_id())
    value = stream.seal_batch("data", [41], ["orders.eu"], [b"payload"])[0].as_py()
    key_id = int.from_bytes(value[1:HEADER_SIZE], "big")
    assert value[0] == VERSION and len(value) == len(b"payload") + OVERHEAD
    iv, rest = value[HEADER_SIZE:PREFIX_SIZE], value[PREFIX_SIZE:]
    aad = f"{stream.stream_id}:41:data:orders.eu".encode()
    assert aad == associated_data(stream.stream_id, 41, "data", "orders.eu")
    assert AESGCM(_raw_key(stream, key_id)).decrypt(iv, rest, aad) == b"payload"


def test_the_single_message_path_matches_the_batch(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    value = stream.seal_one("data", 7, "orders.eu", b"one")
    assert stream.open_one("data", 7, "orders.eu", value) == b"one"
    assert stream.open_batch("data", [7], ["orders.eu"], [value]).values == [b"one"]


@pytest.mark.parametrize(("seq", "field", "subject"), [(2, "data", "orders.eu"), (1, "headers", "orders.eu"),
                                                       (1, "data", "orders.us")])
def test_a_value_moved_to_another_message_field_or_subject_fails(ring: Keyring, seq: int, field: str,
                                                                 subject: str) -> None:
    stream = ring.stream(new_stream_id())
    value = stream.seal_one("data", 1, "orders.eu", b"bound")
    with pytest.raises(ValueAuthenticationError):
        stream.open_one(field, seq, subject, value)


def test_a_value_moved_to_another_stream_fails(ring: Keyring) -> None:
    one, other = ring.stream(new_stream_id()), ring.stream(new_stream_id())
    value = one.seal_one("data", 1, "orders.eu", b"bound")
    other.seal_one("data", 1, "orders.eu", b"gives the other stream a key with the same id")
    with pytest.raises(ValueAuthenticationError):
        other.open_one("data", 1, "orders.eu", value)


@pytest.mark.parametrize("position", [0, 3, HEADER_SIZE + 2, PREFIX_SIZE + 1, -1])
def test_tampering_is_reported_for_that_message_only(ring: Keyring, position: int) -> None:
    stream = ring.stream(new_stream_id())
    sealed = stream.seal_batch("data", [1, 2, 3], SUBJECTS, [b"a" * 10, b"b" * 10, b"c" * 10]).to_pylist()
    damaged = bytearray(sealed[1])
    damaged[position] ^= 0x01
    opened = stream.open_batch("data", [1, 2, 3], SUBJECTS, [sealed[0], bytes(damaged), sealed[2]])
    assert opened.values[0] == b"a" * 10 and opened.values[2] == b"c" * 10 and opened.values[1] is None
    assert set(opened.errors) == {1}
    assert not isinstance(opened.errors[1], KeyDestroyedError)
    assert opened.errors[1].err_code == 10051 and opened.errors[1].code == 500


def test_a_value_too_short_or_of_an_unknown_layout_is_refused(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    opened = stream.open_batch("data", [1, 2], SUBJECTS[:2], [b"plain text, never sealed", b"\x01"])
    assert opened.values == [None, None] and set(opened.errors) == {0, 1}
    assert all(isinstance(e, ValueAuthenticationError) for e in opened.errors.values())


def test_nonces_never_repeat_within_or_across_batches(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    seen: set[bytes] = set()
    for start in range(0, 3000, 1000):
        sealed = stream.seal_batch("data", list(range(start, start + 1000)), ["s"] * 1000, [b"x"] * 1000)
        seen.update(v[HEADER_SIZE:PREFIX_SIZE] for v in sealed.to_pylist())
    assert len(seen) == 3000


def test_a_nonce_writer_is_replaced_when_its_counter_runs_out() -> None:
    writers = iter(range(7, 100))
    source = NonceSource(lambda: next(writers), counter_limit=5)
    batches = [source.take(3) for _ in range(4)]
    nonces = np.concatenate(batches)
    assert len({bytes(n) for n in nonces}) == 12
    assert [int.from_bytes(bytes(b[0, :4]), "big") for b in batches] == [7, 8, 9, 10]
    assert [int.from_bytes(bytes(n[8:]), "big") for n in batches[0]] == [0, 1, 2]
    with pytest.raises(ValueError):
        source.take(6)


def test_a_forked_child_takes_a_new_writer(ring: Keyring) -> None:
    parent = ring.nonces.take(1)[0, :4].tobytes()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the writer id of its first nonce, then leave at once
        os.write(write_end, ring.nonces.take(1)[0, :4].tobytes())
        os._exit(0)
    os.close(write_end)
    ready, _, _ = select.select([read_end], [], [], 30)
    child = os.read(read_end, 4) if ready else b""
    os.close(read_end)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert len(child) == 4 and child != parent


def test_sql_expressions_are_built_only_from_safe_names() -> None:
    expression = sql_decrypt("data", "k.key", "0123abcd", "data", subject_sql="subject")
    assert expression == ("try_aes_decrypt(substring(data, 6), k.key, 'GCM', 'DEFAULT', "
                          "concat('0123abcd:', CAST(seq AS STRING), ':data:', subject))")
    with pytest.raises(ValueError):
        sql_decrypt("data", "k.key", "x'; DROP TABLE t; --", "data")
    with pytest.raises(ValueError):
        sql_decrypt("data", "k.key", "0123abcd\n", "data")
    with pytest.raises(ValueError):
        sql_decrypt("data", "k.key", "0123abcd", "payload")


def test_a_batch_with_a_key_per_subject_and_null_rows_opens_back_one_value_at_a_time(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    subjects = ["users.1.a", "users.2.a", "users.1.b", "users.3.a"]
    payloads = [b"one", None, b"three" * 300, b""]
    for given in (payloads, pa.array(payloads, pa.binary())):
        sealed = stream.seal_batch("data", [1, 2, 3, 4], subjects, given)
        assert sealed.null_count == 1
        values = sealed.to_pylist()
        assert len({v[:HEADER_SIZE] for v in values if v}) == 2, "one data key per subject prefix (users.1, users.3)"
        cache: dict = {}
        for seq, subject, value, payload in zip([1, 2, 3, 4], subjects, values, payloads):
            if value is not None:
                assert open_value(memoryview(value), associated_data(stream.stream_id, seq, "data", subject),
                                  cache, stream.key) == payload
        assert stream.open_batch("data", [1, 2, 3, 4], subjects, sealed).values == payloads


def test_the_small_group_path_seals_every_field_as_the_batch_path_would(ring: Keyring) -> None:
    """`seal_rows` (a single publish) takes one key per row and one run of nonces for all its fields:
    each value opens with its own field's and row's associated data, a None stays None, no nonce repeats."""
    stream = ring.stream(new_stream_id(), key_tokens=2)
    subjects = ["users.1.a", "users.2.a", "users.1.b"]
    fields = {"data": [b"one", b"", b"three" * 300], "headers": [None, b'{"A":["2"]}', None],
              "subject": [s.encode() for s in subjects]}
    sealed = stream.seal_rows(40, subjects, fields)
    assert [v is None for v in sealed["headers"]] == [True, False, True]
    values = [v for field in sealed.values() for v in field if v is not None]
    assert len({v[HEADER_SIZE:PREFIX_SIZE] for v in values}) == len(values) == 7
    assert len({v[:HEADER_SIZE] for v in sealed["data"] if v}) == 2, "one data key per subject prefix (users.1, users.2)"
    assert stream.open_batch("data", [40, 41, 42], subjects, sealed["data"]).values == fields["data"]
    assert stream.open_batch("headers", [40, 41, 42], subjects, sealed["headers"]).values == fields["headers"]
    assert stream.open_batch("subject", [40, 41, 42], None, sealed["subject"]).values == fields["subject"]
    moved = stream.open_batch("data", [41, 40, 42], subjects, sealed["data"])
    assert set(moved.errors) == {0, 1} and moved.values[2] == fields["data"][2]


def test_opening_one_value_reports_tampering_and_destroyed_keys(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=1)
    value = stream.seal_one("data", 7, "users", b"secret")
    aad = associated_data(stream.stream_id, 7, "data", "users")
    damaged = bytearray(value)
    damaged[-1] ^= 0x01
    with pytest.raises(ValueAuthenticationError):
        open_value(bytes(damaged), aad, {}, stream.key)
    with pytest.raises(ValueAuthenticationError):
        open_value(value, associated_data(stream.stream_id, 8, "data", "users"), {}, stream.key)
    with pytest.raises(ValueAuthenticationError):
        open_value(value[:OVERHEAD - 1], aad, {}, stream.key)
    stream.destroy_prefix("users")
    with pytest.raises(KeyDestroyedError):
        open_value(value, aad, {}, stream.key)
