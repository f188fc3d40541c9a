"""The chunked home timeline keeps what a row per entry with write timestamps keeps.

The reference is Cassandra's rule for a table of one row per entry: each key's cell
with the highest write timestamp wins (a delete over a write at the same timestamp,
the greater value between two writes), and a clustering-range delete removes every
key at or below its bound written before it. Batches are applied in ``T`` order as
the writer applies them (removes at ``T``, adds at ``T + 1``, a trim at ``T + 2``),
some of them twice (a rerun under the same ``T``), and the rows are read back in
any order.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from views.stores.cassandra import chunks

KEYS = st.tuples(st.integers(1, 6), st.integers(1, 4))
BATCH = st.tuples(st.lists(KEYS, max_size=4),
                  st.lists(st.tuples(KEYS, st.integers(1, 3)), max_size=6),
                  st.booleans(), st.booleans())


class RowPerEntry:
    """A timeline as one row per entry, reconciled as Cassandra does."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], tuple[int, bool, int]] = {}
        self.cuts: list[tuple[tuple[int, int], int]] = []

    def write(self, key: tuple[int, int], ts: int, live: bool, author: int = 0) -> None:
        old = self.cells.get(key)
        if old is None or (ts, not live, author) > (old[0], not old[1], old[2]):
            self.cells[key] = (ts, live, author)

    def entries(self) -> list[tuple[int, int, int]]:
        out = []
        for key, (ts, live, author) in self.cells.items():
            if live and not any(key <= cut and ts <= at for cut, at in self.cuts):
                out.append((key[0], key[1], author))
        return sorted(out, reverse=True)


class Chunked:
    """The same timeline as ``home_chunks`` rows: a row per batch, merged when asked."""

    def __init__(self) -> None:
        self.rows: dict[int, list] = {}  # T -> [removes, adds, (cell ts of each)]

    def put(self, t: int, cell: int, blob: bytes, ts: int) -> None:
        row = self.rows.setdefault(t, [None, None, -1, -1])
        if ts >= row[2 + cell]:
            row[cell], row[2 + cell] = blob, ts

    def merge(self, t: int, cap: int) -> tuple[int, int] | None:
        kept, head = chunks.merged(self.read(random.Random(t)), t, cap)
        for older in [u for u in self.rows if u < t]:
            del self.rows[older]
        self.put(t, 0, b"", t + 2)
        self.put(t, 1, chunks.encode(kept), t + 2)
        return head[cap] if len(head) > cap else None

    def read(self, rng: random.Random) -> list[chunks.Chunk]:
        out = [(t, r[0], r[1]) for t, r in self.rows.items()]
        rng.shuffle(out)
        return out


@settings(max_examples=400, deadline=None)
@given(st.lists(BATCH, max_size=10), st.integers(1, 5), st.randoms(use_true_random=False))
def test_the_fold_keeps_what_rows_with_timestamps_keep(batches, cap, rng) -> None:
    rows, chunked = RowPerEntry(), Chunked()
    for i, (removes, adds, trim, again) in enumerate(batches):
        t = 4 * (i + 1)
        for _ in range(2 if again else 1):
            for key in removes:
                rows.write(key, t, False)
            for key, author in adds:
                rows.write(key, t + 1, True, author)
            if removes:
                chunked.put(t, 0, chunks.encode(np.array(removes).reshape(-1, 2)), t)
            if adds:
                chunked.put(t, 1, chunks.encode(np.array([k + (a,) for k, a in adds])), t + 1)
            if trim:
                cut = chunked.merge(t, cap)
                if cut is not None:
                    rows.cuts.append((cut, t + 2))
        folded = chunks.fold(chunked.read(rng))
        assert [tuple(e) for e in folded.tolist()] == rows.entries()


def test_a_page_is_strictly_below_its_key() -> None:
    entries = np.array([[9, 1, 5], [7, 3, 5], [7, 2, 6], [4, 1, 5]], np.int64)
    assert chunks.page(entries, (7, 3), 2).tolist() == [[7, 2, 6], [4, 1, 5]]
    assert chunks.page(entries, None, 1).tolist() == [[9, 1, 5]]
    assert chunks.page(entries, (1, 0), 5).tolist() == []


def test_blobs_round_trip_and_a_missing_cell_is_empty() -> None:
    rows = np.array([[2**62, -1, 3]], np.int64)
    assert chunks.decode(chunks.encode(rows), 3).tolist() == rows.tolist()
    assert chunks.decode(None, 2).shape == (0, 2)
    assert chunks.fold([(4, None, None)]).shape == (0, 3)
