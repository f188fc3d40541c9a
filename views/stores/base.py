"""The store contract's names in one module, for callers that use several of its parts.

Each part has its own module: the rows (:mod:`views.stores.rows`), the write plan and
its folds (:mod:`views.stores.plan`), and the three sides of a store with their
lifecycle (:mod:`views.stores.contract`). :class:`PageVersions` and :data:`Position` are
serving's (:mod:`serving.pageversions`), here for the readers outside serving that take
a store's page tokens (``verify``).
"""

from serving.pageversions import PageVersions, Position
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
    "FollowRow", "HomeStart", "Hydrated", "PageVersions", "Position", "ProfileRow",
    "ReaderProxy", "RelationRow", "Relations", "Store", "StoreAdmin", "TimelineReader",
    "TweetRow", "UserRow", "ViewWriter", "WritePlan", "as_entry", "fold", "id_conflict",
    "outranks", "stored_conflicts",
)
