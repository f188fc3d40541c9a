"""The changelogs read in batch (``views.changelog``), against the session's broker."""

from __future__ import annotations

from collections import Counter

from ingest.generator import generate
from ingest.settings import KafkaSettings
from tests.support.changelog import produce
from views.changelog import read_changelog
from views.reference import Reference


def test_a_log_read_in_two_parts_is_the_log_read_whole(kafka_settings: KafkaSettings) -> None:
    # What `fanout rebuild --beside` does when it compares users at successive positions
    # of a view: the records up to one position, then those after it.
    history = generate(60, 500, 300, seed=3)
    produce(kafka_settings, history.events())
    whole = read_changelog(kafka_settings)
    cut = {tp: end // 2 for tp, end in whole.ends.items()}
    first = read_changelog(kafka_settings, until=cut)
    rest = read_changelog(kafka_settings, since=cut)
    assert len(first.events) == sum(cut.values())
    assert len(rest.events) == len(whole.events) - len(first.events) > 0
    assert Counter(map(repr, first.events + rest.events)) == Counter(map(repr, whole.events))
    parts, once = Reference().add(first.events).add(rest.events), Reference().add(whole.events)
    users = sorted(once.users())
    assert users
    assert [parts.home_fast(u, 50) for u in users] == [once.home_fast(u, 50) for u in users]
