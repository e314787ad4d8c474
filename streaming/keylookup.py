"""Where each event ID hash of a join partition's known table is, kept from batch to batch (``streaming.rules``)."""
from __future__ import annotations

import numpy as np
import pandas as pd


class KeyLookup:
    """Where each ID hash of a partition's known table is, kept from batch to batch. pandas builds an index's hash
    table once per ``Index`` object, and the table changes every batch (sends appended, decided IDs forgotten): built
    anew, that was two hash tables of the whole state a batch (325,000 IDs at 5,000 events/s), the join's largest
    cost. So the indexes built stay (``pieces``), each with where its rows are now (-1: forgotten); a batch adds a
    piece of its new sends, and after ``MAX_PIECES`` the table's own index is built once again."""

    MAX_PIECES = 8

    def __init__(self, pieces: list[tuple[pd.Index, np.ndarray]], size: int) -> None:
        self.pieces, self.size = pieces, size

    @classmethod
    def of(cls, index: pd.Index) -> KeyLookup:
        return cls([(index, np.arange(len(index)))], len(index))

    @property
    def nbytes(self) -> int:
        """Its pieces' arrays, and each index's hash table (about three times its keys')."""
        return sum(4 * index.nbytes + now.nbytes for index, now in self.pieces)

    def positions(self, keys: np.ndarray) -> np.ndarray:
        """Each key's row, -1 for a key not known (a key forgotten and sent again is found in its newer piece)."""
        out = np.full(len(keys), -1, dtype=np.int64)
        for index, now in self.pieces:
            found = index.get_indexer(keys)
            hit = np.flatnonzero(found >= 0)
            if len(hit):
                row = now[found[hit]]
                out[hit[row >= 0]] = row[row >= 0]
        return out

    def appended(self, index: pd.Index) -> KeyLookup | None:
        """After rows with these keys were appended to the table (None when a new index is due)."""
        if len(self.pieces) >= self.MAX_PIECES:
            return None
        return KeyLookup([*self.pieces, (index, np.arange(self.size, self.size + len(index)))], self.size + len(index))

    def kept(self, keep: np.ndarray) -> KeyLookup:
        """After the table kept only the rows where ``keep`` is true."""
        moved = np.where(keep, np.cumsum(keep) - 1, -1)
        pieces = [(index, np.where(now >= 0, moved[np.maximum(now, 0)], -1)) for index, now in self.pieces]
        return KeyLookup([(i, now) for i, now in pieces if (now >= 0).any()], int(keep.sum()))
