"""The ``transformWithStateInPandas`` processor: moves rows between Spark and the join.

All decisions live in :mod:`views.join`; this module only unpacks the bucket's
changes (:func:`views.packed.read_packed`), loads and stores state, and yields the
join's deltas packed in one row (:data:`~views.delta.PACKED_DELTA_DDL`).

Spark groups rows by a hash *bucket* of the author (``views.job``), not by author:
a call per author cost ~2.3 ms of fixed overhead (DESIGN §10), so the processor is
called once per bucket and runs :func:`~views.join.apply_batch` for each author in
it. A bucket's state is a :class:`~views.codec.Layout` (one value) and pages of
authors' encoded states (a map state keyed by page number, :mod:`views.codec`): a
batch reads the layout, the pages of the authors it touches, and writes them back,
so its cost follows the authors it touches, not the bucket's size. Its input is
packed too, a few rows per bucket rather than one per record (:mod:`views.packed`
says why). Invalid records become dead-letter deltas, and so do late ones (the join
judges lateness against marks kept in each author's state, :mod:`views.join`); every
call also reports the highest offset it saw per partition, which the sink records as
applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.streaming.stateful_processor import (
    MapState,
    StatefulProcessor,
    StatefulProcessorHandle,
    ValueState,
)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from views.codec import (
    DEFAULT_PAGE_BYTES,
    Layout,
    decode_page,
    decode_state,
    encode_page,
    encode_state,
    page_size,
)
from views.delta import Delta, pack_deltas
from views.join import Change, JoinConfig, apply_batch
from views.packed import read_packed, settle_worker

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

LAYOUT_SCHEMA: Final = StructType([StructField(name, LongType(), False)
                                   for name in ("level", "split", "size")])
PAGE_KEY_SCHEMA: Final = StructType([StructField("page", LongType(), False)])
PAGE_SCHEMA: Final = StructType([StructField("authors", BinaryType(), False)])

#: What reading a page costs Spark's state store: a round trip to the JVM
#: (DESIGN §10: ~120–260 µs) and ~17.5 ns a byte (docs/capacity.md V9: ~35 ns a
#: byte read and written back). They decide when one scan of a bucket's pages is
#: cheaper than a read per page.
_CALL_S: Final = 190e-6
_BYTE_S: Final = 17.5e-9

Pages = dict[int, dict[int, bytes]]


class JoinProcessor(StatefulProcessor):
    """Per-author state in Spark; the join logic in :func:`views.join.apply_batch`."""

    def __init__(self, config: JoinConfig, page_bytes: int = DEFAULT_PAGE_BYTES) -> None:
        self.config = config
        self.page_bytes = page_bytes

    def init(self, handle: StatefulProcessorHandle) -> None:
        settle_worker()
        self.layout: ValueState = handle.getValueState("layout", LAYOUT_SCHEMA)
        self.pages: MapState = handle.getMapState("pages", PAGE_KEY_SCHEMA, PAGE_SCHEMA)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues: Any) -> Iterator[pd.DataFrame]:
        # pandas is imported here, not with the module: Spark's driver unpickles the
        # processor while it plans the query, in a Python process of its own, only to
        # call init(); pandas was ~0.4 s of that on the first batch's critical path.
        import pandas as pd  # noqa: PLC0415

        changes, deltas = read_packed(rows)
        if changes:
            deltas += self._join(changes)
        if deltas:
            yield pd.DataFrame({"deltas": [pack_deltas(deltas)]})

    def _join(self, changes: dict[int, list[Change]]) -> list[Delta]:
        """Apply a bucket's changes: read the touched pages, join, split, write back."""
        stored = self.layout.get()  # None when missing (one state call, not two)
        before = Layout(*stored) if stored else Layout()
        touched = before.by_page(changes)
        raw = self._read(touched, before) if stored else {}
        pages = {page: decode_page(raw[page]) if page in raw else {} for page in touched}
        deltas: list[Delta] = []
        for page, authors in touched.items():
            deltas += self._apply(pages[page], authors, changes)
        layout = before.grown(sum(page_size(pages[p]) - len(raw.get(p, b"")) for p in pages))
        while layout.full(self.page_bytes):
            layout = self._split(layout, pages, raw)
        for page, states in pages.items():
            self.pages.updateValue((page,), (encode_page(states),))
        self.layout.update((layout.level, layout.split, layout.size))
        return deltas

    def _apply(self, states: dict[int, bytes], authors: list[int],
               changes: dict[int, list[Change]]) -> list[Delta]:
        """The join for ``authors`` of one page, their encoded states updated in place."""
        deltas: list[Delta] = []
        for author in authors:
            blob = states.get(author)
            before = decode_state(blob) if blob is not None else None
            after, out = apply_batch(before, author, changes[author], self.config)
            states[author] = encode_state(after)
            deltas += out
        return deltas

    def _read(self, pages: Iterable[int], layout: Layout) -> dict[int, Any]:
        """The stored pages ``pages`` (encoded), or every page when one scan costs less.

        A scan is one round trip for up to thousands of pages
        (``spark.sql.execution.arrow.transformWithStateInPySpark.maxStateRecordsPerBatch``)
        but moves the untouched pages' bytes too: it pays for a batch that touches
        most of a bucket, as a bulk replay does.
        """
        wanted = list(pages)
        untouched = layout.pages - len(wanted)
        if (len(wanted) - 1) * _CALL_S > untouched * layout.size / layout.pages * _BYTE_S:
            return {key[0]: value[0] for key, value in self.pages.iterator()}
        found = ((page, self.pages.getValue((page,))) for page in wanted)
        return {page: value[0] for page, value in found if value is not None}

    def _split(self, layout: Layout, pages: Pages, raw: dict[int, Any]) -> Layout:
        """Split the layout's next page, reading it first if this batch has not."""
        page, new, after = layout.split_next()
        if page not in pages:
            blob = raw.get(page)
            if blob is None:
                stored = self.pages.getValue((page,))
                blob = stored[0] if stored is not None else None
            pages[page] = decode_page(blob) if blob is not None else {}
        states = pages[page]
        moved = after.by_page(states).get(new, [])
        pages[new] = {author: states.pop(author) for author in moved}
        return after

    def close(self) -> None:
        pass
