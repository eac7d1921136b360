"""The keyring on the object-store interface (engine/keys/storage.py's `ObjectKeyringFiles`), on the local
object store and on a real S3 server (versitygw): what the local-folder keyring promises, kept by
whole-object writes under a lease instead of appends under a `flock`."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import ManualClock
from engine.keys import (
    KeyDestroyedError,
    Keyring,
    KeyringCorruptError,
    MasterKey,
    UnknownKeyError,
    ValueAuthenticationError,
    WrongMasterKeyError,
)
from engine.keys.keyfile import HEADER_NAME, STREAM_SUFFIX
from engine.keys.storage import ObjectKeyringFiles
from engine.store.objectstore import ObjectStore, WarehouseLocation
from tests.keys.conftest import ACCOUNT, new_stream_id

WRONG = MasterKey.from_config("not-the-key-0123456789abcdefXYZ!", "aes")


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        yield WarehouseLocation.parse(str(tmp_path / "warehouse")).open()
    else:
        yield request.getfixturevalue("s3_server").location(f"keys-{uuid.uuid4().hex[:10]}").open()


@pytest.fixture
def files(store: ObjectStore) -> ObjectKeyringFiles:
    return ObjectKeyringFiles(store, f"{ACCOUNT}/_system/keys")


def versions(store: ObjectStore) -> dict[str, str]:
    return {meta.key: meta.version for meta in store.list()}


def test_a_restart_reads_everything_and_the_wrong_key_changes_nothing(files: ObjectKeyringFiles, store: ObjectStore,
                                                                     master: MasterKey, clock: ManualClock) -> None:
    ring = Keyring.open(files, ACCOUNT, master, clock=clock)
    stream_id = new_stream_id()
    values = ring.stream(stream_id).seal_batch("data", [1, 2], ["a.b", "a.c"], [b"one", b"two"])
    assert Keyring.exists(files) and set(files.names()) == {HEADER_NAME, f"{stream_id}{STREAM_SUFFIX}"}
    before = versions(store)
    with pytest.raises(WrongMasterKeyError, match="nothing was changed"):
        Keyring.open(files, ACCOUNT, WRONG)
    assert versions(store) == before
    again = Keyring.open(files, ACCOUNT, master)
    assert again.stream(stream_id).open_batch("data", [1, 2], ["a.b", "a.c"], values).values == [b"one", b"two"]
    with pytest.raises(KeyringCorruptError, match="not 'BILLING'"):
        Keyring.open(files, "BILLING", master)


def test_a_new_master_key_rewraps_every_key(files: ObjectKeyringFiles, master: MasterKey) -> None:
    stream_id = new_stream_id()
    values = Keyring.open(files, ACCOUNT, master).stream(stream_id).seal_batch("data", [1], ["a.b"], [b"one"])
    new = MasterKey.from_config("the-new-key-0123456789abcdefXYZ!", "chachapoly")
    assert Keyring.open(files, ACCOUNT, new, previous=master).stream(stream_id).open_batch(
        "data", [1], ["a.b"], values).values == [b"one"]
    with pytest.raises(WrongMasterKeyError):
        Keyring.open(files, ACCOUNT, master)
    assert not [n for n in files.names() if n.endswith(".new")]


def test_two_gateways_see_each_others_keys_rotations_and_destructions(files: ObjectKeyringFiles, master: MasterKey,
                                                                      clock: ManualClock) -> None:
    """Two keyrings on one prefix, as two gateways (or a gateway and a job) on one bucket."""
    one, two = Keyring.open(files, ACCOUNT, master, clock=clock), Keyring.open(files, ACCOUNT, master, clock=clock)
    stream_id = new_stream_id()
    first = one.stream(stream_id, key_tokens=1).seal_batch("data", [1], ["a.x"], [b"from one"])
    second = two.stream(stream_id, key_tokens=1).seal_batch("data", [2], ["b.x"], [b"from two"])
    assert one.stream(stream_id).open_batch("data", [2], ["b.x"], second).values == [b"from two"]
    assert two.stream(stream_id).open_batch("data", [1], ["a.x"], first).values == [b"from one"]
    assert one.stream(stream_id).rotate() == 2
    two.stream(stream_id).refresh()
    assert two.stream(stream_id).epoch == 2
    rotated = two.stream(stream_id, key_tokens=1).seal_batch("data", [3], ["a.x"], [b"epoch two"])
    assert one.stream(stream_id).open_batch("data", [3], ["a.x"], rotated).values == [b"epoch two"]
    assert one.stream(stream_id).destroy_prefix("a")
    two.stream(stream_id).refresh()  # as a gateway picks up what a job changed
    opened = two.stream(stream_id).open_batch("data", [1, 3], ["a.x", "a.x"], [first[0].as_py(), rotated[0].as_py()])
    assert all(isinstance(e, KeyDestroyedError) for e in opened.errors.values()) and len(opened.errors) == 2
    writers = {one.nonces.take(1)[0, :4].tobytes(), two.nonces.take(1)[0, :4].tobytes()}
    assert len(writers) == 2


def test_threads_of_two_keyrings_create_prefix_keys_once(files: ObjectKeyringFiles, master: MasterKey) -> None:
    rings = [Keyring.open(files, ACCOUNT, master) for _ in range(2)]
    stream_id = new_stream_id()
    subjects = [f"users.{i % 5}.x" for i in range(50)]
    results: list[list[bytes]] = []

    def publish(ring: Keyring, first: int) -> None:
        seqs = list(range(first, first + 50))
        results.append(ring.stream(stream_id, key_tokens=2).seal_batch("data", seqs, subjects, [b"v"] * 50).to_pylist())

    threads = [threading.Thread(target=publish, args=(rings[t % 2], 1 + 50 * t)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 4
    assert len({v[1:5] for values in results for v in values}) == 5, "one key per prefix, whichever keyring made it"


def test_destroying_the_keyring_removes_every_object(files: ObjectKeyringFiles, store: ObjectStore,
                                                     master: MasterKey) -> None:
    ring = Keyring.open(files, ACCOUNT, master)
    stream_id, other_id = new_stream_id(), new_stream_id()
    keys = ring.stream(stream_id)
    value = keys.seal_one("data", 1, "a.b", b"x")
    ring.stream(other_id).seal_one("data", 1, "a.b", b"y")
    ring.destroy_stream(other_id)
    assert set(files.names()) == {HEADER_NAME, f"{stream_id}{STREAM_SUFFIX}"}
    destroyed = ring.destroy()
    assert destroyed.files == 2 and destroyed.bytes > 0
    assert not list(store.list(files.prefix)), "no object, the lock included, is left"
    with pytest.raises(KeyDestroyedError):
        keys.open_one("data", 1, "a.b", value)
    with pytest.raises(KeyDestroyedError):  # a destroyed keyring makes no new keys
        ring.stream(new_stream_id())
    fresh = Keyring.open(files, ACCOUNT, master)  # the same master key derives nothing of the old keyring
    with pytest.raises((UnknownKeyError, ValueAuthenticationError)):
        fresh.stream(stream_id).open_one("data", 1, "a.b", value)


def test_stream_keys_without_a_header_are_not_overwritten(files: ObjectKeyringFiles, master: MasterKey) -> None:
    Keyring.open(files, ACCOUNT, master).stream(new_stream_id()).seal_one("data", 1, "a.b", b"x")
    files.scrub(HEADER_NAME)
    with pytest.raises(KeyringCorruptError, match="holds stream keys but no keyring.json"):
        Keyring.open(files, ACCOUNT, master)
