"""The processor over Spark's state API, in memory (pyspark's ``TwsTester``), no JVM.

Its state is a layout and pages of authors per key bucket (``views.codec``). Whatever
the batches and however the pages split, it must give exactly what the pure join
gives author by author (the deltas and the states), read and write only the pages of
the authors a batch touches, and keep pages near their size. A checkpoint of another
state layout is refused before the query starts, saying how to rebuild.
"""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from unittest.mock import MagicMock

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import MapState
from pyspark.sql.streaming.tws_tester import TwsTester

from ingest.events import Delete, Event, Follow, Post, encode
from ingest.settings import KafkaSettings
from views import job
from views.codec import LAYOUT, Layout, decode_page, decode_state
from views.delta import Delta, DeltaKind, pack_deltas, unpack_deltas
from views.errors import ViewError
from views.join import AuthorState, Change, JoinConfig, apply_batch
from views.packed import Packer
from views.processor import JoinProcessor
from views.settings import ViewSettings
from views.source import event_row

BIG = 2**63 - 1
BUCKET = 5
CONFIG = JoinConfig.with_ratio(40, 30)


class Reference:
    """The pure join, author by author: what the processor must give."""

    def __init__(self) -> None:
        self.states: dict[int, AuthorState] = {}

    def run(self, batch: list[tuple[int, Event]]) -> list[Delta]:
        by_key: dict[int, list[Change]] = defaultdict(list)
        for offset, event in batch:
            by_key[event.key].append(Change.of(event, offset))
        deltas: list[Delta] = []
        for key, changes in by_key.items():
            self.states[key], out = apply_batch(self.states.get(key), key, changes, CONFIG)
            deltas += out
        return unpack_deltas(pack_deltas(deltas))  # as the processor's output carries them


def _frame(batch: Sequence[tuple[int, Event]]) -> pd.DataFrame:
    """The batch's records packed for one bucket, as the job's decode packs them."""
    packer = Packer()
    for offset, event in batch:
        packer.add(BUCKET, event_row(event.topic, 0, offset, *encode(event)))
    return pd.DataFrame({"rows": packer.batch().column("rows").to_pylist()})


def _run(tester: TwsTester, batch: Sequence[tuple[int, Event]]) -> list[Delta]:
    out: pd.DataFrame = tester.testInPandas(BUCKET, _frame(batch))
    deltas = [d for blob in out.get("deltas", []) for d in unpack_deltas(blob)]
    return [d for d in deltas if d.kind != DeltaKind.OFFSET]


def _history(rng: random.Random, authors: list[int], n: int, first: int
             ) -> list[tuple[int, Event]]:
    """``n`` follows and posts among ``authors``, numbered by offset from ``first``."""
    out: list[tuple[int, Event]] = []
    for offset in range(first, first + n):
        author = rng.choice(authors)
        follower = rng.choice([*authors[:20], BIG])
        if rng.random() < 0.7 and follower != author:
            event: Event = Follow(follower, author, rng.randrange(99))
        else:
            event = Post(offset + 1, author, rng.randrange(99), f"t{offset}")
        out.append((offset, event))
    return out


def _stored(tester: TwsTester) -> tuple[Layout, dict[int, bytes], dict[int, int]]:
    """The bucket's layout, its pages (encoded) and the page each author is on."""
    layout = Layout(*tester.peekValueState("layout", BUCKET) or ())
    pages = {key[0]: value[0] for key, value in tester.peekMapState("pages", BUCKET).items()}
    where = {author: page for page, blob in pages.items() for author in decode_page(blob)}
    return layout, pages, where


def test_paged_state_gives_the_pure_joins_deltas_and_states():
    rng = random.Random(7)
    authors = [*rng.sample(range(1, 10**6), 400), BIG]
    tester = TwsTester(JoinProcessor(CONFIG, page_bytes=1024))
    reference = Reference()
    offset = 0
    # A bulk load (every page touched: one scan), then batches that touch a few pages.
    for size in (3000, 40, 1, 500, 7, 2000, 60, 3):
        batch = _history(rng, authors, size, offset)
        offset += size
        assert sorted(_run(tester, batch), key=repr) == sorted(reference.run(batch), key=repr)
    layout, pages, where = _stored(tester)
    assert layout.pages == len(pages) > 16  # it split, many times
    assert layout.size == sum(map(len, pages.values()))
    assert all(layout.page_of(author) == page for author, page in where.items())
    states = {a: decode_state(s) for blob in pages.values() for a, s in decode_page(blob).items()}
    assert states == reference.states


def _loaded(authors: int, page_bytes: int) -> TwsTester:
    rng = random.Random(3)
    ids = rng.sample(range(1, 10**9), authors)
    tester = TwsTester(JoinProcessor(CONFIG, page_bytes=page_bytes))
    batch = [(i, Follow(10**9 + i, rng.choice(ids), i)) for i in range(authors * 8)]
    tester.testInPandas(BUCKET, _frame(batch))
    return tester


def test_a_batch_reads_and_writes_only_the_pages_it_touches():
    tester = _loaded(3000, 2048)
    layout, pages, where = _stored(tester)
    assert layout.pages > 40
    processor = tester.processor
    assert isinstance(processor, JoinProcessor)
    spy = MagicMock(spec_set=MapState, wraps=processor.pages)
    processor.pages = spy
    author = next(iter(where))
    _run(tester, [(10**6, Post(10**7, author, 5, "one post"))])
    assert [c.args[0] for c in spy.getValue.call_args_list] == [(where[author],)]
    assert [c.args[0] for c in spy.updateValue.call_args_list] == [(where[author],)]
    assert spy.iterator.call_count == 0
    after, stored, _ = _stored(tester)
    assert after.pages == layout.pages and len(stored[where[author]]) > len(pages[where[author]])


def test_a_split_reads_the_page_it_splits_when_the_batch_has_not():
    tester = _loaded(1000, 2048)
    layout, pages, where = _stored(tester)
    author = next(a for a, page in where.items() if page != layout.split)
    room = 2048 * layout.pages - layout.size  # bytes until the next split
    follows = [(10**6 + i, Follow(10**10 + i, author, 50)) for i in range(room // 17 + 1)]
    processor = tester.processor
    assert isinstance(processor, JoinProcessor)
    spy = MagicMock(spec_set=MapState, wraps=processor.pages)
    processor.pages = spy
    _run(tester, follows)
    read = [c.args[0] for c in spy.getValue.call_args_list]
    assert read == [(where[author],), (layout.split,)]
    written = sorted(c.args[0] for c in spy.updateValue.call_args_list)
    assert written == sorted({(where[author],), (layout.split,), (layout.pages,)})
    after, stored, now = _stored(tester)
    assert after.pages == layout.pages + 1 and after.size == sum(map(len, stored.values()))
    assert now.keys() == where.keys() and all(after.page_of(a) == p for a, p in now.items())


def test_pages_stay_near_their_size_whatever_the_bucket_holds():
    for authors in (500, 5000):
        layout, pages, _ = _stored(_loaded(authors, 4096))
        assert layout.size <= 4096 * layout.pages
        assert max(map(len, pages.values())) < 4 * 4096, (authors, layout)


def test_late_records_and_pruned_state_go_through_the_pages_as_in_the_pure_join():
    """With a lateness bound: the pure join's dead letters (with their partition) and states.

    Days of follows, unfollows, posts and deletes, some records days late: the pages
    hold what the pure join holds after pruning, and shrink when it prunes.
    """
    day, config = 86_400_000, JoinConfig(cap=5, promote_at=30, demote_below=24,
                                         lateness=86_400_000)
    rng = random.Random(11)
    authors = rng.sample(range(1, 10**6), 60)
    tester = TwsTester(JoinProcessor(config, page_bytes=1024))
    states: dict[int, AuthorState] = {}
    offset, sizes, late = 0, [], 0
    for today in range(13):
        batch: list[tuple[int, Event]] = []
        for i in range(300 if today < 12 else 2 * len(authors)):
            author = rng.choice(authors) if today < 12 else authors[i // 2]
            at = (today + 5 - (3 if rng.random() < 0.05 else 0)) * day + rng.randrange(day)
            if today == 12:  # a week on: one post and one follow each, and the bound passes
                at = 30 * day
            event: Event = (Follow(rng.randrange(1, 50), author, at, active=rng.random() < 0.5)
                            if (rng.random() < 0.5 if today < 12 else i % 2)
                            else Delete(rng.randrange(1, 400), author, at)
                            if today < 12 and rng.random() < 0.3
                            else Post(10**7 + offset, author, at, "p"))
            batch.append((offset, event))
            offset += 1
        packer = Packer()
        by_key: dict[int, list[Change]] = defaultdict(list)
        for off, event in batch:
            packer.add(BUCKET, event_row(event.topic, 2, off, *encode(event)))
            by_key[event.key].append(Change.of(event, off, partition=2))
        want: list[Delta] = []
        for key, changes in by_key.items():
            states[key], out = apply_batch(states.get(key), key, changes, config)
            want += out
        frame = pd.DataFrame({"rows": packer.batch().column("rows").to_pylist()})
        out_frame: pd.DataFrame = tester.testInPandas(BUCKET, frame)
        got = [d for blob in out_frame.get("deltas", []) for d in unpack_deltas(blob)
               if d.kind != DeltaKind.OFFSET]
        want = unpack_deltas(pack_deltas(want))
        assert sorted(got, key=repr) == sorted(want, key=repr)
        late += sum(d.kind == DeltaKind.DEAD and d.partition == 2 for d in got)
        sizes.append(_stored(tester)[0].size)
    _, pages, _ = _stored(tester)
    stored = {a: decode_state(s) for blob in pages.values() for a, s in decode_page(blob).items()}
    assert stored == states
    assert late > 0
    # A week on, every tombstone and dead edge is past the bound: gone, and the pages
    # shrank although the batch added a post and a follow per author.
    assert not any(s.tombstones for s in states.values())
    assert all(on or at == 30 * day for s in states.values() for at, on in s.followers.values())
    assert sizes[-1] < sizes[-2], sizes


# -- a checkpoint of another state layout ------------------------------------------------

def _view(tmp_path: Path) -> ViewSettings:
    return ViewSettings(store_url=f"sqlite:///{tmp_path / 'v.sqlite'}",
                        checkpoint_dir=tmp_path / "ck", key_buckets=64, shuffle_partitions=2)


def _started(path: Path) -> None:
    (path / "offsets").mkdir(parents=True)
    (path / "offsets" / "0").write_text("{}")


def test_a_checkpoint_of_another_layout_is_refused_with_how_to_rebuild(tmp_path, caplog):
    view = _view(tmp_path)
    assert job.other_layout(view) is None  # nothing there yet
    (view.checkpoint_dir / "state-v2-p2-b64").mkdir(parents=True)
    assert job.other_layout(view) is None  # created, never started
    _started(view.checkpoint_dir / "state-v2-p2-b64")
    refused = job.other_layout(view)
    assert refused is not None and "layout v2" in refused and "fanout rebuild" in refused
    spark = MagicMock(spec_set=SparkSession)
    with pytest.raises(ViewError, match="fanout rebuild"):
        job.start_query(spark, KafkaSettings(bootstrap="127.0.0.1:1"), view, MagicMock())
    caplog.set_level(logging.ERROR, logger="views.job")
    code = job.run(spark, KafkaSettings(bootstrap="127.0.0.1:1"), view, threading.Event())
    assert code == job.EXIT_LAYOUT and "fanout rebuild" in caplog.text
    assert not spark.mock_calls and not (tmp_path / "v.sqlite").exists()
    # Once this layout's own checkpoint has started (the views were rebuilt beside), go on.
    assert job.checkpoint_path(view).name == f"state-v{LAYOUT}-p2-b64"
    _started(job.checkpoint_path(view))
    assert job.other_layout(view) is None
