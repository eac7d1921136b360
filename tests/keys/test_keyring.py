from __future__ import annotations

import json
import threading
import shutil
from pathlib import Path

import pytest

from engine import ManualClock
from engine.keys import Keyring, KeyringCorruptError, MasterKey, UnknownKeyError, WrongMasterKeyError
from engine.keys.keyfile import HEADER_NAME, MAGIC, STREAM_SUFFIX
from tests.keys.conftest import ACCOUNT, all_bytes, new_stream_id, snapshot

WRONG = MasterKey.from_config("not-the-key-0123456789abcdefXYZ!", "aes")


def _sealed(ring: Keyring, stream_id: str) -> list[bytes]:
    return ring.stream(stream_id).seal_batch("data", [1, 2], ["a.b", "a.c"], [b"one", b"two"]).to_pylist()


def _opened(ring: Keyring, stream_id: str, values: list[bytes]) -> list[bytes | None]:
    opened = ring.stream(stream_id).open_batch("data", [1, 2], ["a.b", "a.c"], values)
    assert not opened.errors, opened.errors
    return opened.values


def test_a_restart_with_the_same_key_reads_everything(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    assert Keyring.exists(keys_dir)
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    again = Keyring.open(keys_dir, ACCOUNT, master)
    assert _opened(again, stream_id, values) == [b"one", b"two"]


def test_the_wrong_master_key_is_refused_and_changes_nothing(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    before = snapshot(keys_dir)
    message = f"does not open the keyring of account '{ACCOUNT}'.*nothing was changed"
    with pytest.raises(WrongMasterKeyError, match=message):
        Keyring.open(keys_dir, ACCOUNT, WRONG)
    with pytest.raises(WrongMasterKeyError):
        Keyring.open(keys_dir, ACCOUNT, WRONG, previous=MasterKey.from_config("also-wrong-0123456789abcdef!!!!"))
    assert snapshot(keys_dir) == before
    assert _opened(Keyring.open(keys_dir, ACCOUNT, master), stream_id, values) == [b"one", b"two"]


def test_the_previous_key_opens_it_once_and_the_new_one_takes_over(ring: Keyring, keys_dir: Path,
                                                                   master: MasterKey) -> None:
    """nats-server's `prev_encryption_key`: every key is re-wrapped under the new master key."""
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    new = MasterKey.from_config("the-new-key-0123456789abcdefXYZ!", "chachapoly")
    rotated = Keyring.open(keys_dir, ACCOUNT, new, previous=master)
    assert _opened(rotated, stream_id, values) == [b"one", b"two"]
    assert json.loads((keys_dir / HEADER_NAME).read_bytes())["cipher"] == "chachapoly"
    with pytest.raises(WrongMasterKeyError):
        Keyring.open(keys_dir, ACCOUNT, master)
    assert _opened(Keyring.open(keys_dir, ACCOUNT, new), stream_id, values) == [b"one", b"two"]
    assert not [p for p in keys_dir.iterdir() if p.suffix in (".new", ".tmp")]


def test_a_new_cipher_with_the_same_key_converts_the_wrapping(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    converted = Keyring.open(keys_dir, ACCOUNT, MasterKey(master.secret, "chachapoly"))
    assert json.loads((keys_dir / HEADER_NAME).read_bytes())["cipher"] == "chachapoly"
    assert _opened(converted, stream_id, values) == [b"one", b"two"]


def test_an_interrupted_master_key_switch_is_discarded_or_finished(tmp_path: Path, ring: Keyring, keys_dir: Path,
                                                                    master: MasterKey) -> None:
    """A crash before the new header was written leaves `.keys.new` files the old header does not
    open (discarded); after it, `.keys.new` files the new header opens (finished)."""
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    new = MasterKey.from_config("the-new-key-0123456789abcdefXYZ!", "aes")
    switched = tmp_path / "switched"
    shutil.copytree(keys_dir, switched)
    Keyring.open(switched, ACCOUNT, new, previous=master)
    name = f"{stream_id}{STREAM_SUFFIX}"

    before_commit = tmp_path / "before-commit"
    shutil.copytree(keys_dir, before_commit)
    shutil.copy(switched / name, before_commit / f"{name}.new")
    assert _opened(Keyring.open(before_commit, ACCOUNT, master), stream_id, values) == [b"one", b"two"]
    assert not (before_commit / f"{name}.new").exists()

    after_commit = tmp_path / "after-commit"
    shutil.copytree(keys_dir, after_commit)
    shutil.copy(switched / HEADER_NAME, after_commit / HEADER_NAME)
    shutil.copy(switched / name, after_commit / f"{name}.new")
    assert _opened(Keyring.open(after_commit, ACCOUNT, new), stream_id, values) == [b"one", b"two"]
    assert not (after_commit / f"{name}.new").exists()


def test_a_tampered_header_is_refused_and_changes_nothing(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    _sealed(ring, new_stream_id())
    header = json.loads((keys_dir / HEADER_NAME).read_bytes())
    header["writers"] = 0  # a rolled-back writer count would hand out used nonces again
    (keys_dir / HEADER_NAME).write_text(json.dumps(header))
    before = snapshot(keys_dir)
    with pytest.raises(KeyringCorruptError, match="tampered"):
        Keyring.open(keys_dir, ACCOUNT, master)
    assert snapshot(keys_dir) == before


def test_a_tampered_stream_file_is_refused(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    stream_id = new_stream_id()
    _sealed(ring, stream_id)
    path = keys_dir / f"{stream_id}{STREAM_SUFFIX}"
    data = bytearray(path.read_bytes())
    data[len(MAGIC) + 12] ^= 0x01
    path.write_bytes(bytes(data))
    again = Keyring.open(keys_dir, ACCOUNT, master)
    with pytest.raises(KeyringCorruptError, match="fails authentication"):
        again.stream(stream_id)


def test_a_torn_append_is_dropped(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    stream_id = new_stream_id()
    values = _sealed(ring, stream_id)
    path = keys_dir / f"{stream_id}{STREAM_SUFFIX}"
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x00\x60\x02half a record")
    again = Keyring.open(keys_dir, ACCOUNT, master)
    assert _opened(again, stream_id, values) == [b"one", b"two"]
    later = again.stream(stream_id).seal_batch("data", [3], ["a.d"], [b"three"])  # appends over the torn tail
    reopened = Keyring.open(keys_dir, ACCOUNT, master).stream(stream_id)
    assert reopened.open_batch("data", [3], ["a.d"], later).values == [b"three"]


def test_stream_keys_without_a_header_are_not_overwritten(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    _sealed(ring, new_stream_id())
    (keys_dir / HEADER_NAME).unlink()
    before = snapshot(keys_dir)
    with pytest.raises(KeyringCorruptError, match="no keyring.json"):
        Keyring.open(keys_dir, ACCOUNT, master)
    assert snapshot(keys_dir) == before


def test_another_accounts_keyring_is_refused(ring: Keyring, keys_dir: Path, master: MasterKey) -> None:
    with pytest.raises(KeyringCorruptError, match="not 'BILLING'"):
        Keyring.open(keys_dir, "BILLING", master)


def test_no_subject_prefix_is_written_in_clear(ring: Keyring, keys_dir: Path) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    stream.seal_batch("data", [1, 2], ["users.marker4711.a", "users.marker4712.b"], [b"x", b"y"])
    assert b"marker471" not in all_bytes(keys_dir)


def test_two_processes_see_each_others_keys(ring: Keyring, keys_dir: Path, master: MasterKey,
                                            clock: ManualClock) -> None:
    """Two keyrings on one folder, as the gateway and a job: keys one creates, the other finds."""
    stream_id = new_stream_id()
    other = Keyring.open(keys_dir, ACCOUNT, master, clock=clock)
    first = ring.stream(stream_id, key_tokens=1).seal_batch("data", [1], ["a.x"], [b"from the first"])
    second = other.stream(stream_id, key_tokens=1).seal_batch("data", [2], ["b.x"], [b"from the second"])
    assert ring.stream(stream_id).open_batch("data", [2], ["b.x"], second).values == [b"from the second"]
    assert other.stream(stream_id).open_batch("data", [1], ["a.x"], first).values == [b"from the first"]
    third = ring.stream(stream_id, key_tokens=1).seal_batch("data", [3], ["c.x"], [b"third"])
    assert other.stream(stream_id).open_batch("data", [3], ["c.x"], third).values == [b"third"]
    writer_ids = {ring.nonces.take(1)[0, :4].tobytes(), other.nonces.take(1)[0, :4].tobytes()}
    assert len(writer_ids) == 2


def test_a_key_id_never_seen_is_unknown_not_erased(ring: Keyring) -> None:
    stream = ring.stream(new_stream_id())
    value = bytearray(stream.seal_one("data", 1, "a.b", b"x"))
    value[1:5] = (999).to_bytes(4, "big")
    with pytest.raises(UnknownKeyError):
        stream.open_one("data", 1, "a.b", bytes(value))


def test_threads_sealing_at_once_share_keys_and_never_a_nonce(ring: Keyring) -> None:
    """The publish path's threads: new prefix keys are created once, nonces stay unique."""
    stream = ring.stream(new_stream_id(), key_tokens=2)
    subjects = [f"users.{i % 7}.x" for i in range(200)]
    results: list[tuple[int, list[bytes]]] = []

    def publish(first_seq: int) -> None:
        seqs = list(range(first_seq, first_seq + 200))
        results.append((first_seq, stream.seal_batch("data", seqs, subjects, [b"%d" % s for s in seqs]).to_pylist()))

    threads = [threading.Thread(target=publish, args=(1 + 200 * t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(results) == 8
    assert len({v[5:17] for _, values in results for v in values}) == 1600
    assert len({v[1:5] for _, values in results for v in values}) == 7
    for first_seq, values in results:
        seqs = list(range(first_seq, first_seq + 200))
        assert stream.open_batch("data", seqs, subjects, values).values == [b"%d" % s for s in seqs]
