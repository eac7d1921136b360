"""The registry of an account's streams: each found by its name or by a subject it captures, and opened
on its first use (engine/catalog.py: until then it is its config record). A stream whose recovery
failed stays registered but unavailable: every request on it is a 503 and the others serve. Answers
of subject routing are cached until the set of streams or their subjects change. Counterpart: the
streams map of server/jetstream.go's account and its `lookupStream`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from engine import errors
from engine.catalog import CatalogEntry, StreamEntries, StreamRecord
from engine.consumers import Consumers
from engine.store.tombstones import TombstoneView
from engine.stream import Stream
from engine.stream_factory import StreamFactory

_SUBJECT_CACHE = 100_000  # routed subjects remembered before the cache starts over


class StreamRegistry:
    """Every stream of one account by name (`entries`), under `lock`.

    `deposed` says why this gateway no longer owns the warehouse (None while it does): no stream is
    opened after that. `tombstones`, read at start, serves the recoveries of streams opened later."""

    def __init__(self, factory: StreamFactory, consumers: Consumers, deposed: Callable[[], str | None]) -> None:
        self.entries = StreamEntries()
        self.lock = threading.RLock()
        self.tombstones: TombstoneView | None = None
        self._by_subject: dict[str, str | None] = {}
        self._factory = factory
        self._consumers = consumers
        self._deposed = deposed

    def items(self) -> list[tuple[str, CatalogEntry]]:
        """Every (name, entry) of the registry now, taken under its lock."""
        with self.lock:
            return list(self.entries.items())

    def streams(self) -> list[Stream]:
        """The streams opened so far (each serves; the catalog's others have nothing in memory to report)."""
        with self.lock:
            return [e.stream for e in self.entries.values() if e.stream is not None]

    def opened_now(self) -> list[Stream]:
        """The streams opened so far, without the lock (a publish's quota check and the close)."""
        return [e.stream for e in list(self.entries.values()) if e.stream is not None]

    def register(self, name: str, stream: Stream) -> None:
        """An opened stream serves under `name` from now on (made, or taken over from another gateway)."""
        with self.lock:
            self.entries[name] = CatalogEntry.of(stream)
            self._by_subject.clear()

    def unregister(self, name: str) -> None:
        """The stream is gone from this gateway (deleted, handed over, lost)."""
        with self.lock:
            self.entries.pop(name, None)
            self._by_subject.clear()

    def rerouted(self, name: str) -> None:
        """A config update may have changed the stream's subjects: routes and cached answers follow."""
        with self.lock:
            self.entries.rerouted(name)
            self._by_subject.clear()

    def open_all(self) -> None:
        for entry in list(self.entries.values()):
            self.opened(entry)

    def opened(self, entry: CatalogEntry) -> Stream:
        return entry.open(self._open_later)

    def _open_later(self, record: StreamRecord) -> Stream:
        """A stream's first use after the start: recovered, its consumers restored."""
        deposed = self._deposed()
        if deposed is not None:
            raise errors.UnavailableError(f"this gateway no longer owns the warehouse: {deposed}")
        stream = self._factory.recover(record, None, self.tombstones)  # nothing wrote its tombstones since
        if stream.recovered:
            self._consumers.restore_stream(stream)
        return stream

    def stream(self, name: str) -> Stream:
        """The stream `name`, opened; a 404 when there is none, a 503 when it is unavailable."""
        entry = self.entries.get(name)
        if entry is None:
            raise errors.StreamNotFoundError()
        stream = self.opened(entry)
        check_available(stream)
        return stream

    def stream_if_open(self, name: str) -> Stream | None:
        """The stream if it is open (an event loop's no-wait path); None when opening it is still to do."""
        entry = self.entries.get(name)
        if entry is None or entry.stream is None:
            return None
        check_available(entry.stream)
        return entry.stream

    def entry_for_subject(self, subject: str, open_: bool = True) -> CatalogEntry | None:
        """The stream capturing a literal subject, opened unless `open_` is False (then it may not be);
        answers are cached until the set of streams changes."""
        try:
            name = self._by_subject[subject]
        except KeyError:
            with self.lock:
                name = self.entries.capturing(subject)
                if len(self._by_subject) > _SUBJECT_CACHE:
                    self._by_subject.clear()
                self._by_subject[subject] = name
        entry = self.entries.get(name) if name else None
        if entry is not None and open_:
            self.opened(entry)
        return entry


def check_available(stream: Stream) -> None:
    if stream.unavailable is not None:
        raise errors.UnavailableError(f"stream {stream.name} is unavailable: {stream.unavailable}")
