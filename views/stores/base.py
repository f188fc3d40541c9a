"""The store contract's names in one module, for callers that use several of its parts.

Each part has its own module: the rows (:mod:`views.stores.rows`), the write plan and
its folds (:mod:`views.stores.plan`), and the three sides of a store with their
lifecycle (:mod:`views.stores.contract`). Serving's page tokens over a store are
serving's own (:func:`serving.pageversions.page_versions`).
"""

from views.stores.contract import (
    BatchStats,
    ReaderProxy,
    Store,
    StoreAdmin,
    TimelineReader,
    ViewWriter,
)
from views.stores.plan import ID_CONFLICTS, WritePlan, fold, id_conflict, outranks, stored_conflicts
from views.stores.rows import (
    DORMANT,
    FLOOR,
    BatchInfo,
    DeadLetter,
    DeadRow,
    Entry,
    FollowRow,
    HomeStart,
    Hydrated,
    ProfileRow,
    RelationRow,
    Relations,
    TweetRow,
    UserRow,
    as_entry,
)

__all__ = (
    "DORMANT", "FLOOR", "ID_CONFLICTS", "BatchInfo", "BatchStats", "DeadLetter", "DeadRow", "Entry",
    "FollowRow", "HomeStart", "Hydrated", "ProfileRow",
    "ReaderProxy", "RelationRow", "Relations", "Store", "StoreAdmin", "TimelineReader",
    "TweetRow", "UserRow", "ViewWriter", "WritePlan", "as_entry", "fold", "id_conflict",
    "outranks", "stored_conflicts",
)
