"""Reading history files: formats, synthetic edge times, merge order, bad lines counted."""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
from pathlib import Path

import pytest

from ingest import cli as ingest_cli
from ingest import generator
from ingest.events import (
    BLOCK,
    FOLLOWS,
    MUTE,
    TOPIC_RANK,
    TWEETS,
    USERS,
    AccountDelete,
    Delete,
    Follow,
    Post,
    Relation,
    Unrepost,
    UserUpsert,
    encode,
)
from ingest.history import (
    EdgeTimes,
    ReadReport,
    census,
    follow_edges,
    is_edge_list,
    iter_events,
    merge_by_time,
)
from ingest.social import SOCIAL
from tests.support.history import EVERY_KIND, RECORDS_CSV, jsonl
from tests.support.paths import ROOT

EGO = ROOT.parent / "shared" / "data" / "ego-twitter" / "follows.txt.gz"
needs_ego = pytest.mark.skipif(not EGO.exists(), reason=f"{EGO} not present")


def write_gz(path: Path, lines: list[str]) -> Path:
    with gzip.open(path, "wt") as fh:
        fh.writelines(line + "\n" for line in lines)
    return path


@pytest.fixture(scope="module")
def ego_head(tmp_path_factory) -> Path:
    """The first 10,000 lines of the real ego-twitter file (one self-loop, line 9332)."""
    if not EGO.exists():
        pytest.skip(f"{EGO} not present")
    with gzip.open(EGO, "rt") as fh:
        head = [line.rstrip("\n") for line in itertools.islice(fh, 10_000)]
    return write_gz(tmp_path_factory.mktemp("ego") / "follows.txt.gz", head)


# -- SNAP edge lists ---------------------------------------------------------------


def test_ego_head_counts_its_self_loop(ego_head):
    report = ReadReport()
    events = list(iter_events(ego_head, report))
    assert len(events) == 9_999
    assert report.skipped == {"self-loop": 1}
    assert report.invalid == 0
    assert any(":9332:" in example for example in report.examples)
    assert all(isinstance(e, Follow) and e.active and e.follower_id != e.followee_id
               for e in events)
    assert (events[0].follower_id, events[0].followee_id) == (12, 13)


def test_ego_head_gets_evenly_spaced_times(ego_head):
    times = EdgeTimes(start_ms=1_000_000, step_ms=7)
    events = list(iter_events(ego_head, edge_times=times))
    assert [e.created_at for e in events[:3]] == [1_000_000, 1_000_007, 1_000_014]
    assert events[-1].created_at == 1_000_000 + 7 * (len(events) - 1)


@needs_ego
def test_ego_twitter_whole_file():
    report = ReadReport()
    followers = generator.follower_counts(iter_events(EGO, report))  # one streaming pass
    assert sum(followers.values()) == 1_768_149 - 14
    assert len(followers) == 81_306
    assert max(followers.values()) == 3_383
    assert report.skipped == {"self-loop": 14}
    assert report.invalid == 0


def test_edge_list_bad_lines_are_counted_not_fatal(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text("# a comment\n1 2\n\n3\n4 x\n0 5\n6 7 8\n9 9\n-1 2\n"
                    f"{2**63} 1\n10\t11\n")
    report = ReadReport()
    events = list(iter_events(path, report))
    assert [(e.follower_id, e.followee_id) for e in events] == [(1, 2), (10, 11)]
    assert report.invalid == 6
    assert report.skipped == {"self-loop": 1}
    assert report.examples[0] == "edges.txt:4: expected 'follower followee', got 1 fields"
    assert "edges.txt:5: followee id 'x' is not an integer" in report.examples
    rendered = report.render()
    assert "invalid lines: 6" in rendered and "self-loop" in rendered


ZERO_BASED = "# a 0-based SNAP graph\n0 1\n1 2\n2 0\n3 0\n"


def test_zero_based_edge_list_without_offset_says_use_id_offset(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text(ZERO_BASED)
    report = ReadReport()
    events = list(iter_events(path, report))
    assert [(e.follower_id, e.followee_id) for e in events] == [(1, 2)]
    assert (report.invalid, report.zero_ids) == (3, 3)
    assert report.examples[0] == ("edges.txt:2: follower id 0 is not a positive 64-bit id "
                                  "(a 0-based graph? replay with --id-offset 1)")
    assert "lines with node id 0: 3 (a 0-based graph? replay with --id-offset 1)" \
        in report.render()


def test_zero_based_edge_list_with_offset_keeps_every_edge(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text(ZERO_BASED)
    report = ReadReport()
    events = list(iter_events(path, report, EdgeTimes(0, 1), id_offset=1))
    assert events == [Follow(1, 2, 0), Follow(2, 3, 1), Follow(3, 1, 2), Follow(4, 1, 3)]
    assert (report.invalid, report.zero_ids) == (0, 0)
    assert census(path, id_offset=1).follower_counts == {2: 1, 1: 2, 3: 1, 4: 0}


def test_zero_based_csv_with_and_without_offset(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("follower_id,followee_id\n0,1\n1,0\n")
    report = ReadReport()
    assert list(iter_events(path, report)) == []
    assert "f.csv:2: follower id 0 is not a positive 64-bit id (a 0-based graph? " \
           "replay with --id-offset 1)" in report.examples
    assert report.zero_ids == 2
    assert list(iter_events(path, edge_times=EdgeTimes(0, 1), id_offset=1)) == [
        Follow(1, 2, 0), Follow(2, 1, 1)]


def test_an_offset_past_the_id_range_is_named_in_the_message(tmp_path):
    path = tmp_path / "edges.txt"
    path.write_text(f"{2**63 - 1} 1\n")
    report = ReadReport()
    assert list(iter_events(path, report, id_offset=1)) == []
    assert report.examples == [f"edges.txt:1: follower id {2**63} (with --id-offset 1) is "
                               "not a positive 64-bit id"]
    assert report.zero_ids == 0


def test_replay_command_takes_id_offset(tmp_path, capsys):
    path = tmp_path / "edges.txt"
    path.write_text(ZERO_BASED)
    for extra, expected in (([], "replayed 3 events"), (["--id-offset", "1"],
                                                         "replayed 8 events")):
        args = _parse_replay([str(path), "--dry-run", "--no-progress", *extra])
        assert args.func(args) == 0
        out = capsys.readouterr().out
        assert expected in out  # edges plus one profile per user
        assert ("--id-offset 1" in out) == (not extra)


def _parse_replay(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fanout")
    ingest_cli.register(parser.add_subparsers(required=True))
    return parser.parse_args(["replay", *argv])


def test_edge_times_spread_over_a_window():
    times = EdgeTimes.spread(1000, 10_000, 20_000)
    assert (times.start_ms, times.step_ms) == (10_000, 10)
    assert EdgeTimes.spread(10**9, 0, 1000).step_ms == 1


# -- CSV ---------------------------------------------------------------------------------


def test_csv_without_header(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("1,2\n2,3\n3,1\n")
    events = list(iter_events(path, edge_times=EdgeTimes(100, 10)))
    assert events == [Follow(1, 2, 100), Follow(2, 3, 110), Follow(3, 1, 120)]


def test_csv_with_header_and_times_in_any_column_order(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("created_at,followee_id,follower_id\n500,2,1\n600,1,2\n")
    assert list(iter_events(path)) == [Follow(1, 2, 500), Follow(2, 1, 600)]
    assert census(path).timed


def test_csv_with_times_but_no_header(tmp_path):
    path = write_gz(tmp_path / "f.csv.gz", ["1,2,500", "2,1,600"])
    assert list(iter_events(path)) == [Follow(1, 2, 500), Follow(2, 1, 600)]
    assert census(path).timed


def test_csv_bad_rows_are_counted(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("follower_id,followee_id\n1,2\n1\n1,x\n4,4\n1,2,3\n5,6\n")
    report = ReadReport()
    events = list(iter_events(path, report, EdgeTimes(0, 1)))
    assert events == [Follow(1, 2, 0), Follow(5, 6, 1)]
    assert report.invalid == 3
    assert report.skipped == {"self-loop": 1}
    assert "f.csv:3: missing followee id" in report.examples
    assert "f.csv:6: more fields than the header names" in report.examples


def test_csv_bad_time_is_counted(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("follower_id,followee_id,created_at\n1,2,soon\n1,3,-5\n1,4,7\n")
    report = ReadReport()
    assert list(iter_events(path, report)) == [Follow(1, 4, 7)]
    assert report.invalid == 2


def test_csv_header_without_ids_is_an_error(tmp_path):
    path = tmp_path / "f.csv"
    path.write_text("source,target\n1,2\n")
    with pytest.raises(ValueError, match="lacks followee_id, follower_id"):
        list(iter_events(path))


# -- JSONL and generator directories ---------------------------------------------------


def test_jsonl_mixes_topics_by_op(tmp_path):
    events = [UserUpsert(1, "a", "A", 10), Follow(2, 1, 20), Post(5, 1, 30, "hi"),
              Delete(5, 1, 40), Follow(2, 1, 50, active=False)]
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"".join(encode(e)[1] + b"\n" for e in events))
    assert list(iter_events(path)) == events


def test_jsonl_invalid_lines_are_counted_with_reasons(tmp_path):
    good = encode(Post(5, 1, 30, "hi"))[1].decode()
    lines = [good, "not json", "[1]", '{"v":1,"op":"retweet"}',
             '{"v":1,"op":"follow","follower_id":3,"followee_id":3,"created_at":1}',
             '{"v":1,"op":"post","tweet_id":6,"author_id":true,"created_at":1,"text":"x"}',
             "", good.replace('"tweet_id":5', '"tweet_id":7')]
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ReadReport()
    events = list(iter_events(path, report))
    assert [e.tweet_id for e in events] == [5, 7]
    assert report.invalid == 5
    assert report.examples[0].startswith("h.jsonl:2: value is not JSON")
    assert report.examples[1] == "h.jsonl:3: value is JSON list, not an object"
    assert report.examples[2] == "h.jsonl:4: unknown op 'retweet'"
    assert report.examples[3] == "h.jsonl:5: user 3 cannot follow themselves"
    assert report.examples[4] == "h.jsonl:6: author_id must be an integer, got bool"


def test_jsonl_out_of_order_is_reported(tmp_path):
    path = tmp_path / "h.jsonl"
    events = [Follow(1, 2, 50), Follow(1, 3, 40), Follow(1, 4, 60)]
    path.write_bytes(b"".join(encode(e)[1] + b"\n" for e in events))
    report = ReadReport()
    assert list(iter_events(path, report)) == events
    assert report.out_of_order == 1


def test_generator_directory_reads_back_in_time_order(tmp_path):
    made = generator.generate(200, 1_500, 800, seed=11)
    generator.write(made, tmp_path)
    report = ReadReport()
    assert list(iter_events(tmp_path, report)) == list(made.events())
    assert report.invalid == 0 and report.out_of_order == 0


def test_directory_without_history_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="users.jsonl"):
        iter_events(tmp_path)


def test_gzipped_jsonl_is_detected(tmp_path):
    path = write_gz(tmp_path / "h.jsonl.gz", [encode(Follow(1, 2, 3))[1].decode()])
    assert list(iter_events(path)) == [Follow(1, 2, 3)]


# -- merging ----------------------------------------------------------------------------


def test_merge_by_time_orders_and_breaks_ties_stably():
    users = [UserUpsert(1, "a", "", 10), UserUpsert(2, "b", "", 30)]
    follows = [Follow(1, 2, 10), Follow(2, 1, 20), Follow(3, 1, 30)]
    tweets = [Post(1, 1, 10, "x"), Post(2, 1, 10, "y"), Post(3, 2, 30, "z")]
    merged = list(merge_by_time(users, tweets, follows))
    assert merged == [Follow(1, 2, 10), Post(1, 1, 10, "x"), Post(2, 1, 10, "y"),
                      UserUpsert(1, "a", "", 10), Follow(2, 1, 20), Follow(3, 1, 30),
                      Post(3, 2, 30, "z"), UserUpsert(2, "b", "", 30)]
    assert TOPIC_RANK[FOLLOWS] < TOPIC_RANK[TWEETS] < TOPIC_RANK[USERS]


def test_merge_by_time_streams_lazily():
    def endless(start: int, step: int):
        for i in itertools.count():
            yield Follow(start, start + 1, start + i * step)

    head = list(itertools.islice(merge_by_time(endless(1, 2), endless(10, 3)), 6))
    assert [e.created_at for e in head] == sorted(e.created_at for e in head)


def test_merge_of_edge_list_and_generated_tweets(tmp_path, ego_head):
    result = census(ego_head)
    lo, hi = generator.activity_window(generator.DEFAULT_START_MS, generator.DEFAULT_SPAN_MS)
    made = generator.for_graph(result.follower_counts, 2_000, seed=1)
    merged = list(merge_by_time(iter_events(ego_head, None, EdgeTimes.spread(result.edges, lo, hi)),
                                made.events()))
    assert len(merged) == result.edges + len(made.users) + len(made.tweets)
    times = [e.created_at for e in merged]
    assert times == sorted(times)
    assert isinstance(merged[0], UserUpsert), "profiles come before any activity"
    json.dumps(result.follower_counts)  # plain ints, serialisable


# -- the records of DESIGN §4b in JSONL, generator directories and CSV -----------------------


def test_jsonl_holds_every_kind_of_record(tmp_path):
    report = ReadReport()
    assert list(iter_events(jsonl(tmp_path / "h.jsonl", EVERY_KIND), report)) == EVERY_KIND
    assert (report.invalid, report.out_of_order) == (0, 0)


def test_the_two_deletes_are_told_apart_by_their_fields(tmp_path):
    lines = ['{"v":1,"op":"delete","user_id":3,"created_at":5}',
             '{"v":1,"op":"delete","tweet_id":9,"author_id":3,"created_at":6}',
             '{"v":1,"op":"delete","created_at":7}',
             '{"v":1,"op":"delete","user_id":3,"tweet_id":9,"author_id":3,"created_at":8}',
             '{"v":1,"op":"delete","tweet_id":9,"created_at":9}']
    path = tmp_path / "h.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ReadReport()
    assert list(iter_events(path, report)) == [AccountDelete(3, 5), Delete(9, 3, 6)]
    assert report.examples == [
        "h.jsonl:3: a delete names neither a tweet (tweet_id, author_id) nor an account "
        "(user_id)",
        "h.jsonl:4: unexpected field(s) user_id",
        "h.jsonl:5: missing field author_id"]


def test_social_generator_directory_reads_back_in_time_order(tmp_path):
    made = generator.generate(200, 1_500, 800, seed=11, mix=SOCIAL)
    assert made.counts()["reposts"] and made.counts()["blocks"]
    generator.write(made, tmp_path)
    report = ReadReport()
    assert list(iter_events(tmp_path, report)) == list(made.events())
    assert report.invalid == 0 and report.out_of_order == 0


@pytest.mark.parametrize("gzipped", [False, True])
def test_csv_of_records_holds_every_kind(tmp_path, gzipped):
    path = tmp_path / ("h.csv.gz" if gzipped else "h.csv")
    if gzipped:
        write_gz(path, RECORDS_CSV)
    else:
        path.write_text("\n".join(RECORDS_CSV) + "\n")
    report = ReadReport()
    assert list(iter_events(path, report)) == EVERY_KIND
    assert report.invalid == 0
    assert not is_edge_list(path), "a CSV of records is replayed like JSONL"


def test_csv_of_records_takes_any_column_order_and_only_the_columns_it_needs(tmp_path):
    path = tmp_path / "blocks.csv"
    path.write_text("op,followee_id,follower_id,created_at,v\nblock,2,1,5,1\nunmute,3,1,6,\n")
    assert list(iter_events(path)) == [Relation(1, 2, 5, BLOCK),
                                       Relation(1, 3, 6, MUTE, active=False)]


def test_csv_of_records_counts_bad_rows_with_their_reasons(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("op,created_at,tweet_id,author_id,original_tweet_id,original_author_id,"
                    "follower_id,followee_id,user_id,text,in_reply_to_user_id\n"
                    "repost,5,7,2,x,3,,,,,\n"          # an id that is not a number
                    "repost,,7,2,6,3,,,,,\n"           # no time
                    "repost,5,7,2,7,3,,,,,\n"          # its own original
                    "block,5,,,,,4,4,,,\n"             # self-block
                    "post,5,8,2,,,,,,hi,2\n"           # self-reply
                    "retweet,5,7,2,6,3,,,,,\n"         # unknown op
                    "delete,5,,,,,,,,,,extra\n"        # more cells than columns
                    "\n"
                    "unrepost,6,7,2,,,,,,,\n")
    report = ReadReport()
    assert list(iter_events(path, report)) == [Unrepost(7, 2, 6)]
    assert report.invalid == 7
    assert report.examples == [
        "h.csv:2: original_tweet_id 'x' is not an integer",
        "h.csv:3: missing field created_at",
        "h.csv:4: repost tweet_id=7 equals original_tweet_id: a repost has its own id",
        "h.csv:5: user 4 cannot block themselves",
        "h.csv:6: in_reply_to_user_id=2 is the author: a self-reply carries none"]


@pytest.mark.parametrize("header,match", [("op,created_at,retweets", "unknown column.*retweets"),
                                          ("op,user_id,user_id", "a column twice")])
def test_csv_of_records_with_a_bad_header_is_an_error(tmp_path, header, match):
    path = tmp_path / "h.csv"
    path.write_text(header + "\n")
    with pytest.raises(ValueError, match=match):
        list(iter_events(path))


def test_csv_without_op_or_edge_columns_names_both_formats(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("tweet_id,author_id\n1,2\n")
    with pytest.raises(ValueError, match="lacks followee_id, follower_id .a CSV of edges.*op"):
        list(iter_events(path))
    assert is_edge_list(path)


def test_follow_edges_are_the_replayed_edges(ego_head):
    times = EdgeTimes(start_ms=5_000, step_ms=3)
    edges = follow_edges(ego_head, times)
    replayed = list(iter_events(ego_head, edge_times=times))
    assert len(edges.follower) == len(replayed) == 9_999
    assert [(int(a), int(b), int(t)) for a, b, t in zip(
        edges.follower, edges.followee, edges.since, strict=True)] == [
        (e.follower_id, e.followee_id, e.created_at) for e in replayed]
