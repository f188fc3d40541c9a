"""How the SQLite store writes: many-row inserts and the checkpoint after a commit."""

from __future__ import annotations

import shutil
import sqlite3

from hypothesis import given
from hypothesis import strategies as st

from views.delta import Delta
from views.stores.sqlite import ROWS_PER_INSERT, SQLiteStore, insert_flat, insert_rows

keys = st.integers(min_value=0, max_value=5)  # collisions: the same key many times
rows = st.lists(st.tuples(keys, keys, st.integers(-2**63, 2**63 - 1)),
                max_size=3 * ROWS_PER_INSERT + 7)


def _table() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.execute("CREATE TABLE t (a INTEGER, b INTEGER, v INTEGER, PRIMARY KEY (a, b))")
    return db


@given(rows, st.sampled_from(["INSERT OR REPLACE INTO t", "INSERT OR IGNORE INTO t"]))
def test_many_row_inserts_equal_one_row_at_a_time(given_rows, head):
    one, many, flat = _table(), _table(), _table()
    one.executemany(f"{head} VALUES (?, ?, ?)", given_rows)
    insert_rows(many, head, 3, given_rows)
    # Flat chunks of any size whole rows, as Kept.flat hands them over.
    values = [v for row in given_rows for v in row]
    split = 3 * (len(given_rows) // 2)
    insert_flat(flat, head, 3, [values[:split], values[split:]])
    expected = one.execute("SELECT * FROM t ORDER BY a, b").fetchall()
    assert many.execute("SELECT * FROM t ORDER BY a, b").fetchall() == expected
    assert flat.execute("SELECT * FROM t ORDER BY a, b").fetchall() == expected


def _fanout(tweet: int, users: list[int]) -> list[Delta]:
    at = 1_900_000_000_000 + tweet
    return [Delta.tweet(tweet, 1, at, "hello"), Delta.fanout(tweet, 1, at, users)]


def test_a_commit_reaches_the_database_file_without_waiting_for_the_next(tmp_path):
    """The write-ahead log is copied into the file after each commit, in the background.

    SQLite's own checkpoint would wait until the log held 1,000 pages, so a small
    batch would live only in the log; a copy of the database file alone shows it.
    """
    store = SQLiteStore(tmp_path / "v.sqlite").open()
    try:
        store.apply(_fanout(7, [2, 3, 4]), 0)
        assert store._checkpointer is not None and store._checkpointer.wait(30)
        shutil.copy(tmp_path / "v.sqlite", tmp_path / "copy.sqlite")  # not the -wal
        copy = sqlite3.connect(tmp_path / "copy.sqlite")
        assert copy.execute("SELECT user_id FROM home_timeline ORDER BY 1").fetchall() == [
            (2,), (3,), (4,)]
        copy.close()
        writer = store._conn()
        assert writer.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
        store.apply(_fanout(8, [2]), 1)  # a second batch after the checkpoint
        assert [e.tweet_id for e in store.cached(2, None, 10)] == [8, 7]
    finally:
        store.close()
    assert store._checkpointer is None


def test_a_writer_neither_waits_on_nor_keeps_a_stopped_checkpointer(tmp_path):
    store = SQLiteStore(tmp_path / "v.sqlite").open()
    try:
        store.apply(_fanout(7, [2]), 0)
        gone = store._checkpointer
        assert gone is not None
        gone.close()  # as if its thread had died
        assert not gone.running and gone.wait(0)
        store.apply(_fanout(8, [2]), 1)
        assert store._checkpointer is not gone and store._checkpointer.running
        assert [e.tweet_id for e in store.cached(2, None, 10)] == [8, 7]
    finally:
        store.close()
