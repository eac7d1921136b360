"""Subject filters as boolean masks over subject ids: how the index tells which subjects a read wants.

A wildcard's mask costs a match of every subject name, so the masks of the last few wildcards are kept
and only extended over the subjects added since.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from engine.subject_table import SubjectTable

_MASKS = 16  # wildcard filters whose subject masks are kept


class SubjectMasks:
    """The masks of filters over one SubjectTable's ids, the recent wildcards' kept."""

    def __init__(self, subjects: SubjectTable) -> None:
        self.subjects = subjects
        self._masks: OrderedDict[str, np.ndarray] = OrderedDict()

    def of(self, filter_: str | list[str] | None) -> np.ndarray | None:
        """A boolean mask over subject ids for a filter (or several), None for "everything"."""
        filters = [filter_] if isinstance(filter_, str) else list(filter_ or [])
        if not filters or ">" in filters:
            return None
        count = len(self.subjects)
        mask = np.zeros(count, np.bool_)
        for f in filters:
            mask |= self._filter_mask(f, count)
        return mask

    def _filter_mask(self, filter_: str, count: int) -> np.ndarray:
        if "*" not in filter_ and ">" not in filter_:
            mask = np.zeros(count, np.bool_)
            sid = self.subjects.find(filter_)
            if sid >= 0:
                mask[sid] = True
            return mask
        cached = self._masks.get(filter_)
        if cached is None or len(cached) < count:
            start = 0 if cached is None else len(cached)
            tail = self.subjects.match_mask(filter_, start)
            cached = tail if cached is None else np.concatenate((cached, tail))
            self._masks[filter_] = cached
            if len(self._masks) > _MASKS:
                self._masks.popitem(last=False)
        self._masks.move_to_end(filter_)
        return cached


def masked(mask: np.ndarray, sids: np.ndarray) -> np.ndarray:
    """Which of `sids` `mask` selects (ids past its end, subjects added since, are not)."""
    inside = sids < len(mask)
    out = np.zeros(len(sids), np.bool_)
    out[inside] = mask[sids[inside]]
    return out
