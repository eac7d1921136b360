"""Rotation and crypto-shredding: destroyed keys leave no byte behind, and their values read as erased."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.keys import KeyDestroyedError, Keyring, MasterKey, StreamKeys, UnknownKeyError
from engine.keys import key_prefix, key_prefix_of_filter
from engine.keys.cipher import key_ref
from engine.keys.keyfile import HEADER_NAME, STREAM_SUFFIX, decode_header, read_stream_file
from tests.keys.conftest import ACCOUNT, all_bytes, new_stream_id

USERS = ["users.1.profile", "users.2.profile", "users.1.orders", "users.2.orders"]


def _seal(stream: StreamKeys, first_seq: int, subjects: list[str]) -> tuple[list[int], list[bytes]]:
    seqs = list(range(first_seq, first_seq + len(subjects)))
    return seqs, stream.seal_batch("data", seqs, subjects, [f"payload {s}".encode() for s in seqs]).to_pylist()


def _errors(stream: StreamKeys, seqs: list[int], subjects: list[str], values: list[bytes]) -> dict[int, type]:
    opened = stream.open_batch("data", seqs, subjects, values)
    for i, value in enumerate(opened.values):
        assert (value is None) == (i in opened.errors)
        assert value is None or value == f"payload {seqs[i]}".encode()
    return {i: type(e) for i, e in opened.errors.items()}


def _key_ids(values: list[bytes]) -> list[int]:
    return sorted({int.from_bytes(v[1:5], "big") for v in values})


def _key_material(stream: StreamKeys, keys_dir: Path, master: MasterKey, key_ids: list[int]) -> list[bytes]:
    """The raw bytes, the wrapped blobs and the prefix tags of some keys, as they are before destruction."""
    raw = dict(stream.sql_keys())
    header, _ = decode_header(keys_dir / HEADER_NAME)
    mac_key = master.account_keys(ACCOUNT, header.salt).mac_key
    state = read_stream_file(keys_dir / f"{stream.stream_id}{STREAM_SUFFIX}", mac_key, stream.stream_id)
    records = [state.keys[k] for k in key_ids]
    return [raw[key_ref(k)] for k in key_ids] + [r.wrapped for r in records] + [r.tag for r in records]


def test_rotation_starts_a_new_epoch_at_once_and_old_values_stay_readable(ring: Keyring, keys_dir: Path,
                                                                          master: MasterKey) -> None:
    stream = ring.stream(new_stream_id())
    old_seqs, old = _seal(stream, 1, USERS)
    old_key = stream.key(int.from_bytes(old[0][1:5], "big"))
    assert stream.rotate() == 2
    new_seqs, new = _seal(stream, 5, USERS)
    new_key_id = int.from_bytes(new[0][1:5], "big")
    assert new_key_id != old_key.key_id and stream.epoch_of(new_key_id) == 2 and stream.epoch_of(old_key.key_id) == 1
    assert _errors(stream, old_seqs + new_seqs, USERS * 2, old + new) == {}
    reopened = Keyring.open(keys_dir, ACCOUNT, master).stream(stream.stream_id)
    assert reopened.epoch == 2 and _errors(reopened, old_seqs + new_seqs, USERS * 2, old + new) == {}


def test_retiring_old_epochs_after_re_encryption(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    old_seqs, old = _seal(stream, 1, USERS)
    stream.rotate()
    new_seqs, new = _seal(stream, 5, USERS)
    with pytest.raises(ValueError):
        stream.retire_epochs_before(3)
    retired = stream.retire_epochs_before(2)
    assert retired == _key_ids(old)
    assert _errors(stream, old_seqs, USERS, old) == {i: KeyDestroyedError for i in range(4)}
    assert _errors(stream, new_seqs, USERS, new) == {}


def test_destroying_a_prefix_erases_it_in_every_epoch_and_nothing_else(ring: Keyring, keys_dir: Path,
                                                                       master: MasterKey) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    seqs1, epoch1 = _seal(stream, 1, USERS)
    stream.rotate()
    seqs2, epoch2 = _seal(stream, 5, USERS)
    destroyed = stream.destroy_prefix("users.1")
    assert len(destroyed) == 2
    erased = {0: KeyDestroyedError, 2: KeyDestroyedError, 4: KeyDestroyedError, 6: KeyDestroyedError}
    assert _errors(stream, seqs1 + seqs2, USERS * 2, epoch1 + epoch2) == erased
    reopened = Keyring.open(keys_dir, ACCOUNT, master).stream(stream.stream_id, key_tokens=2)
    assert _errors(reopened, seqs1 + seqs2, USERS * 2, epoch1 + epoch2) == erased
    assert stream.destroy_prefix("users.1") == []
    later_seqs, later = _seal(stream, 9, ["users.1.profile"])  # a new message after erasure: a new key
    assert _errors(stream, later_seqs, ["users.1.profile"], later) == {}


def test_a_destroyed_key_leaves_no_byte_in_the_keyring(tmp_path: Path, ring: Keyring, keys_dir: Path,
                                                       master: MasterKey) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    _, first = _seal(stream, 1, USERS)
    stream.rotate()
    _, values = _seal(stream, 5, USERS)
    victims = _key_ids([first[0], first[2], values[0], values[2]])  # users.1, both epochs
    material = _key_material(stream, keys_dir, master, victims)
    survivor = _key_material(stream, keys_dir, master, _key_ids([values[1]]))
    path = keys_dir / f"{stream.stream_id}{STREAM_SUFFIX}"
    old_inode = tmp_path / "old-inode"
    os.link(path, old_inode)  # sees the replaced file's own blocks after the rename
    assert all(m in old_inode.read_bytes() for m in material[len(victims):])

    assert stream.destroy_prefix("users.1") == victims
    everything = all_bytes(tmp_path)
    assert not [m for m in material if m in everything]
    stored = survivor[len(survivor) // 3 :]  # the other prefix's wrapped key and tag are still there
    assert all(m in all_bytes(keys_dir) for m in stored)
    assert old_inode.read_bytes() == bytes(len(old_inode.read_bytes()))
    assert not [p for p in keys_dir.iterdir() if p.name.endswith((".tmp", ".new"))]


def test_deleting_a_stream_destroys_its_keys(tmp_path: Path, ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    stream = ring.stream(new_stream_id())
    seqs, values = _seal(stream, 1, USERS)
    path = keys_dir / f"{stream.stream_id}{STREAM_SUFFIX}"
    os.link(path, tmp_path / "old-inode")
    material = _key_material(stream, keys_dir, master, _key_ids(values))
    ring.destroy_stream(stream.stream_id)
    assert not path.exists()
    assert _errors(stream, seqs, USERS, values) == {i: KeyDestroyedError for i in range(4)}
    assert not [m for m in material if m in all_bytes(tmp_path)]


def test_deleting_an_account_destroys_its_keyring(tmp_path: Path, ring: Keyring, keys_dir: Path,
                                                  master: MasterKey) -> None:
    stream = ring.stream(new_stream_id())
    seqs, values = _seal(stream, 1, USERS)
    header_copy = tmp_path / "header-inode"
    os.link(keys_dir / "keyring.json", header_copy)
    ring.destroy()
    assert not keys_dir.exists()
    assert header_copy.read_bytes() == bytes(len(header_copy.read_bytes()))
    assert _errors(stream, seqs, USERS, values) == {i: KeyDestroyedError for i in range(4)}
    fresh = Keyring.open(keys_dir, ACCOUNT, master).stream(stream.stream_id)  # the same master key, a new keyring
    assert _errors(fresh, seqs, USERS, values) == {i: UnknownKeyError for i in range(4)}


def test_subjects_select_keys_by_their_leading_tokens() -> None:
    assert key_prefix("users.42.profile", 2) == "users.42"
    assert key_prefix("users", 2) == "users"
    assert key_prefix("users.42.profile", 0) == ""
    assert key_prefix_of_filter("users.42.>", 2) == "users.42"
    assert key_prefix_of_filter("users.42", 2) == "users.42"
    assert key_prefix_of_filter("users.*.profile", 2) is None
    assert key_prefix_of_filter("users.>", 2) is None
    assert key_prefix_of_filter("users", 2) is None
    assert key_prefix_of_filter("users.42.>", 0) is None
