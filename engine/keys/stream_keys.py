"""One stream's data keys: per key epoch and, optionally, per subject prefix; rotation and shredding.

A data key is found by (epoch, prefix tag) for writing and by its key id (in every sealed value) for
reading. New writes use the current epoch; `rotate` starts a new epoch at once, and older epochs stay
readable until `retire_epochs_before` destroys them (after the compaction job re-encrypted their
values). `destroy_prefix` destroys every epoch's key of a subject prefix: from then on every value
sealed under it answers `KeyDestroyedError` (erased), before any file is rewritten. Key ids are never
reused, so a destroyed id stays distinguishable from one this keyring never had.

Keys are made and unwrapped by engine/keys/key_wrapping.py and held, unwrapped, by the stream's key
cache (engine/keys/stream_key_cache.py), which re-reads the stream's file when another process changed it.
Counterpart: server/filestore.go's per-block keys (`genEncryptionKeys`, `loadEncryptionForMsgBlock`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from engine.clock import Clock
from engine.keys import crypto, keyfile
from engine.keys.cipher import DataKey, OpenedBatch, Payloads, associated_data, associated_data_batch
from engine.keys.cipher import key_ref, open_batch, seal, seal_batch
from engine.keys.errors import ValueAuthenticationError
from engine.keys.key_wrapping import KeyWrapping
from engine.keys.keyfile import DATA
from engine.keys.master import AccountKeys
from engine.keys.nonces import NONCE_SIZE, NonceSource
from engine.keys.stream_key_cache import StreamKeyCache
from engine.keys.subjects import SubjectHasher, key_prefix
from engine.store import failpoints

if TYPE_CHECKING:
    from engine.keys.storage import KeyringFiles

SUBJECT = "subject"
CONFIG_VERSION = 1  # the layout of `seal_config`'s values
ROTATE_FAILPOINT = "keys.rotate"  # engine/store/failpoints.py: the epoch record's durable append


class StreamKeys:
    """The keys of one stream (by stream id), opened or created through its account's `Keyring`."""

    def __init__(self, account: str, files: KeyringFiles, keys: AccountKeys, nonces: NonceSource, clock: Clock,
                 stream_id: str, key_tokens: int = 0) -> None:
        if not keyfile.is_stream_id(stream_id):
            raise ValueError(f"not a stream id: {stream_id!r}")
        self.account = account
        self.stream_id = stream_id
        self.key_tokens = key_tokens
        self._files = files
        name = f"{stream_id}{keyfile.STREAM_SUFFIX}"
        path = files.describe(name)  # for messages
        self._nonces = nonces
        self._wrapping = KeyWrapping(account, stream_id, keys, clock, path)
        self._held = StreamKeyCache(files, name, path, stream_id, self._wrapping, keys.mac_key, clock)

    @property
    def epoch(self) -> int:
        """The key epoch new writes use."""
        return self._held.epoch

    def data_key(self, prefix: str = "") -> DataKey:
        """The current epoch's key of a subject prefix, created (durably) when missing."""
        return self.data_keys([prefix])[prefix]

    def data_keys(self, prefixes: Iterable[str]) -> dict[str, DataKey]:
        """The current epoch's keys of many prefixes; the missing ones are created with one fsync."""
        return self._held.current_keys(prefixes)

    def key(self, key_id: int) -> DataKey:
        """The data key a value names.

        Raises:
            KeyDestroyedError: the key was destroyed (its values are erased).
            UnknownKeyError: this keyring never had it.
        """
        return self._held.key(key_id)

    def epoch_of(self, key_id: int) -> int:
        with self._held.lock:
            return self._held.record(key_id).epoch

    def rotate(self) -> int:
        """Starts a new epoch for new writes, at once; returns it. Older epochs stay readable."""
        with self._held.lock, self._files.locked():
            self._held.sync_locked()
            fault = failpoints.hit(ROTATE_FAILPOINT)
            self._held.append_locked([keyfile.epoch_record(self.epoch + 1)])
            failpoints.after(ROTATE_FAILPOINT, fault)
            return self.epoch

    def destroy_prefix(self, prefix: str) -> list[int]:
        """Crypto-shredding: destroys every epoch's key of a subject prefix; returns their ids."""
        tag = self._wrapping.tag(prefix)
        return self._held.destroy(lambda r: r.purpose == DATA and r.tag == tag)

    def retire_epochs_before(self, epoch: int) -> list[int]:
        """Destroys the data keys of epochs older than `epoch`, once their values were re-encrypted."""
        if epoch > self.epoch:
            raise ValueError(f"epoch {epoch} is newer than the current epoch {self.epoch}")
        return self._held.destroy(lambda r: r.purpose == DATA and r.epoch < epoch)

    def rotation_keys(self) -> list[tuple[bytes, bytes, bytes, bytes]]:
        """(old key_ref, old key, new key_ref, new key) for every live data key of an epoch older than the
        current one, the new key being the current epoch's key of the same subject prefix (created when
        missing): what the compaction job re-encrypts with before `retire_epochs_before`."""
        held, unwrap = self._held, self._wrapping.unwrap
        with held.lock:
            self.refresh()
            old = [r for r in held.state.keys.values() if r.purpose == DATA and r.epoch < self.epoch]
            missing = sorted({r.tag for r in old if (self.epoch, r.tag) not in held.by_tag})
            if missing:
                held.create_tagged(missing)
            out = []
            for record in old:
                new = self.key(held.by_tag[(self.epoch, record.tag)])
                out.append((key_ref(record.key_id), unwrap(record), new.ref, unwrap(held.record(new.key_id))))
            return out

    def subject_hasher(self) -> SubjectHasher:
        """Keyed hashes with this stream's subject key (partition values of protected subjects)."""
        return self._held.subject_hasher()

    def seal_config(self, name: str, payload: bytes) -> bytes:
        """Seals a record of the stream's own (a consumer's config, whose filters name subjects) with the
        config key: HKDF of the subject key, so, like the partition values, it outlives rotations (a
        config is rewritten only when it changes, and must open after older epochs are destroyed).
        Layout: version ‖ 12-byte nonce ‖ ciphertext ‖ tag; bound to the stream and `name`."""
        nonce = self._nonces.one()
        sealed = self._held.config_aead().encrypt(nonce, payload, self._config_aad(name))
        return bytes([CONFIG_VERSION]) + nonce + sealed

    def open_config(self, name: str, value: bytes) -> bytes:
        """Raises ValueAuthenticationError for a value that is not `name`'s, KeyDestroyedError when the
        stream's keys are gone."""
        if len(value) < 1 + NONCE_SIZE + 16 or value[0] != CONFIG_VERSION:
            raise ValueAuthenticationError("not a sealed config of a known layout")
        try:
            nonce, sealed = value[1 : 1 + NONCE_SIZE], value[1 + NONCE_SIZE :]
            return self._held.config_aead().decrypt(nonce, sealed, self._config_aad(name))
        except crypto.InvalidTag:
            raise ValueAuthenticationError("a sealed config failed authentication") from None

    def _config_aad(self, name: str) -> bytes:
        return f"{self.stream_id}:config:{name}".encode()

    def sql_keys(self) -> list[tuple[bytes, bytes]]:
        """(key_ref, key) of every live data key, for a key holder's SQL session (never written down)."""
        with self._held.lock:
            self.refresh()
            live = [r for r in self._held.state.keys.values() if r.purpose == DATA]
            return [(key_ref(r.key_id), self._wrapping.unwrap(r)) for r in live]

    def refresh(self) -> None:
        """Picks up what another process changed (new keys, rotation, destruction)."""
        self._held.refresh()

    def seal_batch(self, field: str, seqs: Sequence[int], subjects: Sequence[str],
                   payloads: Payloads) -> pa.BinaryArray:
        """Seals one field of many messages, each with its subject's key (see cipher.py)."""
        prefixes = [key_prefix(s, self.key_tokens) for s in subjects] if self.key_tokens else None
        keys = self.data_keys(set(prefixes) if prefixes is not None else [""])
        per_row = keys[""] if prefixes is None else [keys[p] for p in prefixes]
        aads = associated_data_batch(self.stream_id, seqs, field, None if field == SUBJECT else subjects)
        return seal_batch(per_row, self._nonces.take(len(payloads)), payloads, aads)

    def seal_rows(self, first_seq: int, subjects: Sequence[str],
                  fields: dict[str, Sequence[bytes | None]]) -> dict[str, list[bytes | None]]:
        """Seals the fields of a few consecutive messages value by value, for a small group that builds
        no Arrow array (a single publish): the layout of `seal_batch`, a None payload stays None.

        One key lookup per row and one nonce hand-out serve every field: per value, what is left is
        its associated data and one `encrypt` (a single publish paid a key lookup and a nonce lock per field).
        """
        keys = self._row_keys(subjects)
        nonces = self._nonces.take_bytes(sum(len(values) - values.count(None) for values in fields.values()))
        at = 0
        out: dict[str, list[bytes | None]] = {}
        for field, payloads in fields.items():
            sealed: list[bytes | None] = []
            for i, payload in enumerate(payloads):
                if payload is None:
                    sealed.append(None)
                    continue
                nonce = nonces[at : at + NONCE_SIZE]
                at += NONCE_SIZE
                aad = associated_data(self.stream_id, first_seq + i, field, "" if field == SUBJECT else subjects[i])
                sealed.append(seal(keys[i], nonce, payload, aad))
            out[field] = sealed
        return out

    def _row_keys(self, subjects: Sequence[str]) -> list[DataKey]:
        """The current key of each subject; the current epoch's keys are read without the lock (a
        rotation or a destruction replaces the cache's `current` whole, as `data_keys` would see it too)."""
        if not self.key_tokens:
            key = self._held.current.get("")
            return [key if key is not None else self.data_key("")] * len(subjects)
        prefixes = [key_prefix(s, self.key_tokens) for s in subjects]
        keys = self.data_keys(set(prefixes))
        return [keys[p] for p in prefixes]

    def open_batch(self, field: str, seqs: Sequence[int], subjects: Sequence[str] | None,
                   values: Payloads) -> OpenedBatch:
        """Opens one field of many messages; failures are reported per message."""
        aads = associated_data_batch(self.stream_id, seqs, field, None if field == SUBJECT else subjects)
        return open_batch(values, aads, self.key)

    def seal_one(self, field: str, seq: int, subject: str, payload: bytes) -> bytes:
        key = self.data_key(key_prefix(subject, self.key_tokens))
        aad = associated_data(self.stream_id, seq, field, "" if field == SUBJECT else subject)
        return seal(key, self._nonces.one(), payload, aad)

    def open_one(self, field: str, seq: int, subject: str | None, value: bytes) -> bytes:
        """Raises KeyDestroyedError, UnknownKeyError or ValueAuthenticationError."""
        batch = self.open_batch(field, [seq], None if subject is None else [subject], [value])
        if 0 in batch.errors:
            raise batch.errors[0]
        return batch.values[0] or b""

    def mark_destroyed(self) -> None:
        """The whole stream's keys are gone (stream or account deleted)."""
        self._held.mark_destroyed()
