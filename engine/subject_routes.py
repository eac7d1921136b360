"""Which stream captures a subject: the streams' subject filters in a token tree, as nats-server keeps
them in a Sublist, so routing a publish and checking a new stream's subjects for overlap cost the
subject's tokens, not the number of streams (a scan over 10,000 streams took ~10 ms a new subject)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from engine.subjects import FWC, PWC


class _Node:
    __slots__ = ("children", "names")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.names: set[str] = set()  # the streams with a filter ending at this node

    def every_name(self) -> Iterator[str]:
        yield from self.names
        for child in self.children.values():
            yield from child.every_name()


class SubjectRoutes:
    """Stream name by subject filter; a name's filters are replaced or dropped together."""

    def __init__(self) -> None:
        self._root = _Node()
        self._filters: dict[str, tuple[str, ...]] = {}

    def set(self, name: str, filters: Iterable[str]) -> None:
        self.discard(name)
        kept = tuple(filters)
        for filter_ in kept:
            node = self._root
            for token in filter_.split("."):
                node = node.children.setdefault(token, _Node())
            node.names.add(name)
        if kept:
            self._filters[name] = kept

    def discard(self, name: str) -> None:
        for filter_ in self._filters.pop(name, ()):
            self._remove(self._root, filter_.split("."), 0, name)

    def _remove(self, node: _Node, tokens: list[str], i: int, name: str) -> None:
        if i == len(tokens):
            node.names.discard(name)
            return
        child = node.children.get(tokens[i])
        if child is None:
            return
        self._remove(child, tokens, i + 1, name)
        if not child.names and not child.children:
            del node.children[tokens[i]]

    def match(self, subject: str) -> str | None:
        """The stream whose filters match the literal `subject` (streams do not overlap: one at most)."""
        return next(self._matches(self._root, subject.split("."), 0), None)

    def _matches(self, node: _Node, tokens: list[str], i: int) -> Iterator[str]:
        if i == len(tokens):
            yield from node.names
            return
        rest = node.children.get(FWC)
        if rest is not None:
            yield from rest.names
        for key in (tokens[i], PWC):
            child = node.children.get(key)
            if child is not None:
                yield from self._matches(child, tokens, i + 1)

    def colliding(self, filter_: str) -> set[str]:
        """The streams with a filter that some literal subject matches together with `filter_`
        (engine/subjects.py `subjects_collide`, for every stream at once)."""
        found: set[str] = set()
        self._collide(self._root, filter_.split("."), 0, found)
        return found

    def _collide(self, node: _Node, tokens: list[str], i: int, found: set[str]) -> None:
        if i == len(tokens):
            found.update(node.names)
            return
        token = tokens[i]
        if token == FWC:
            for child in node.children.values():
                found.update(child.every_name())
            return
        rest = node.children.get(FWC)
        if rest is not None:
            found.update(rest.names)
        if token == PWC:
            for key, child in node.children.items():
                if key != FWC:
                    self._collide(child, tokens, i + 1, found)
            return
        for key in (token, PWC):
            child = node.children.get(key)
            if child is not None:
                self._collide(child, tokens, i + 1, found)
