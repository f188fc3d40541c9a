"""How many candidates a page reads in each round (``serving.timeline._page``).

The sizes decide round trips and work, never what is served; the candidate stream and
the filter here are plain functions, so the sizes a page asks for can be read off.
"""

from __future__ import annotations

import types

from serving.timeline import MAX_BATCH, _page
from serving.visibility import HomeEntry
from views.delta import TOP, Key
from views.stores.rows import Entry


def _sizes(limit: int, served: int, of: int, stream: int = 10_000,
           in_process: bool = True) -> tuple[list[int], int]:
    """The batch sizes a page asks for when ``served`` of every ``of`` candidates pass,
    from a store that reads in process or over a network."""
    asked: list[int] = []
    entries = [Entry(stream - i, stream - i, 1) for i in range(stream)]

    def batch(below: Key, n: int) -> tuple[list[Entry], bool]:
        asked.append(n)
        rest = [e for e in entries if e.key < below][:n]
        return rest, len(rest) == n

    def keep(candidates: list[Entry]) -> list[HomeEntry]:
        return [HomeEntry(c.created_at, c.tweet_id, 1, c.tweet_id, 1) for c in candidates
                if c.tweet_id % of < served]

    store = types.SimpleNamespace(reads_in_process=in_process)
    viewer = types.SimpleNamespace(user=7, tweets={}, users={}, asked=set(), store=store,
                                   reader_deleted=lambda: False)
    page = _page(viewer, batch, TOP, limit, keep)  # type: ignore[arg-type]
    return asked, len(page.entries)


def test_a_page_a_few_entries_short_reads_a_few_dozen_more() -> None:
    # 3 of 5 pass: the first 301 serve 180 or 181, and the 20 missing need about 33
    # more at that share; with half again, 51 — not 602.
    asked, served = _sizes(200, 3, 5)
    assert served == 200
    assert asked[0] == 301 and 40 <= asked[1] <= 60 and len(asked) == 2


def test_a_page_that_served_nothing_doubles_its_batch_up_to_the_largest() -> None:
    asked, served = _sizes(20, 0, 1, stream=3000)
    assert served == 0
    assert asked[:3] == [31, 62, 124] and max(asked) == MAX_BATCH


def test_a_page_a_little_short_at_a_low_share_still_ends_in_a_few_rounds() -> None:
    asked, served = _sizes(200, 1, 10)
    assert served == 200 and len(asked) <= 4 and max(asked) <= MAX_BATCH


def test_over_a_network_the_first_batch_is_two_pages_so_two_fifths_filtered_is_one_round(
) -> None:
    # 3 of 5 pass: in process the first 31 serve 18 and a second round reads 3 more;
    # over a network the first 41 serve 24, so the page is full after one round.
    assert _sizes(20, 3, 5) == ([31, 3], 20)
    assert _sizes(20, 3, 5, in_process=False) == ([41], 20)
