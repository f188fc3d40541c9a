"""The view an API worker serves, and the switch to another one with no request between two.

Every request resolves the view it reads once, at its start: ``app.state.served``, a
:class:`Served` — the store, its page versions and its celebrity cache, opened
together — and uses only that for all its reads, so no request mixes two views. A
switch builds the new :class:`Served` whole, beside the old, and then replaces the
one reference: requests that started before finish on the old view, every request
after reads the new one. The old view is closed after a grace period long enough
for any request still holding it (an ``?after=`` wait included) to finish.

:class:`ViewFollower` makes the switch when the run directory's pointer file
(:mod:`views.pointer`) names another view: it stats the file every
:data:`POLL_S` (a rename gives it a new inode), reads it when it changed, opens the
new view and installs it, then acknowledges the view it serves, which is how
``fanout rebuild --beside`` knows every worker has switched. The page cache needs
no clearing: its entries carry the serial of the view they were rendered from
(:mod:`serving.reads`), and a page of another view is never served.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from serving.celebrities import CelebrityCache
from serving.pageversions import PageVersions, page_versions
from views import pointer
from views.pointer import ViewRecord
from views.stores.contract import Store, TimelineReader
from views.stores.versions import Shards

log = logging.getLogger(__name__)

#: How often a worker looks at the pointer file (one ``stat``).
POLL_S: Final = 0.02
#: How long a failed open of a new view waits before it is tried again.
RETRY_S: Final = 1.0

_serials = itertools.count(1)


@dataclass(frozen=True)
class Served:
    """One view, opened: what a request reads, all of it from the same store."""

    #: The whole store: requests read it (a :class:`TimelineReader`), the metrics its
    #: admin side, and the view closes it.
    store: Store
    versions: PageVersions
    celebrities: CelebrityCache | None
    label: str
    #: Distinct for every view this process opened: the page cache's view key.
    serial: int
    #: The pointer's record it serves (None: the store the settings name).
    record: ViewRecord | None = None

    def close(self, *, own_store: bool = True) -> None:
        """Stop the celebrity cache, close the versions and (if ours) the store."""
        if self.celebrities is not None:
            self.celebrities.stop()
        self.versions.close()
        if own_store:
            self.store.close()


def served(store: Store, label: str,
           celebrities: Callable[[TimelineReader, PageVersions], CelebrityCache | None],
           record: ViewRecord | None = None, shards: Shards = None) -> Served:
    """An opened ``store`` with its versions and celebrity cache, under a new serial.

    ``shards``: the feed shards whose pages the versions keep (None: all).
    """
    versions = page_versions(store, shards)
    versions.keep_fresh()  # cached pages answered on the event loop (serving.reads)
    return Served(store, versions, celebrities(store, versions), label, next(_serials), record)


class ViewFollower:
    """Follows a pointer file; switches ``install`` to the view it names (module doc).

    ``open_view(record)`` opens a record's view; ``install(new)`` makes it the one
    requests read and returns the one it replaces; ``grace_s`` is how long that one
    stays open afterwards.
    """

    def __init__(self, path: Path, open_view: Callable[[ViewRecord], Served],
                 install: Callable[[Served], Served], current: Callable[[], Served | None],
                 grace_s: float) -> None:
        self.path, self.open_view, self.install, self.current = path, open_view, install, current
        self.grace_s = grace_s
        self._stop = threading.Event()
        self._seen: tuple[int, int, int] | None = None
        self._thread: threading.Thread | None = None
        self._retired: list[threading.Timer] = []

    def start(self) -> ViewFollower:
        self.poll()
        self._thread = threading.Thread(target=self._run, name="view-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop following; close the views still in their grace period now."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for timer in self._retired:
            if timer.is_alive():
                timer.cancel()
                timer.function(*timer.args)  # type: ignore[attr-defined]

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.poll()
            except Exception:  # a bad pointer must not stop the API: keep serving, retry
                now = self.current()
                log.exception("could not switch to the view %s names; still serving %s",
                              self.path, now.label if now is not None else "nothing")
                self._seen = None
                self._stop.wait(RETRY_S)

    def poll(self) -> bool:
        """Switch if the pointer names another view; True if this call switched."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return False
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen == self._seen:
            return False
        found = pointer.read(self.path)
        if found is None:
            return False
        switched = False
        now = self.current()
        if now is None or now.record is None or _view(now.record) != _view(found.current):
            new = self.open_view(found.current)
            old = self.install(new)
            if now is not None:
                log.info("switched from %s to %s (view %d)", old.label, new.label,
                         found.current.number)
                self._retire(old)
            switched = True
        self._seen = seen
        pointer.acknowledge(self.path, found.current, found.switch)
        return switched

    def _retire(self, old: Served) -> None:
        timer = threading.Timer(self.grace_s, old.close)
        timer.daemon = True
        timer.start()
        self._retired = [t for t in self._retired if t.is_alive()] + [timer]


def _view(record: ViewRecord) -> tuple[int, str]:
    return record.number, record.store_url
