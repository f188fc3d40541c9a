"""The load generator's live-stream side: the SSE reader, the stream client, push latency.

The stream client (:mod:`loadgen.streamer`, what the Locust ``StreamUser`` runs) is
driven on a thread against the real API served over HTTP on a SQLite store
(``tests.support.streams.World``: readers, normal authors and celebrities merged at
read time), with posts written into the store as the view job would; the push join
(:mod:`loadgen.push`) is fed as a master is, from several processes' reports in an
order where receipts arrive before their accepts; the report gives the split and
the stream figures. The Locust user itself runs in the stack tests
(``test_loadgen_stack.py``), in two processes.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from ingest.events import Post
from loadgen.push import PushLog, StreamTally, classify
from loadgen.report import ModeRun, build, celebrities_of, push_summary
from loadgen.sse import Event, Parser, StreamError
from loadgen.streamer import Habits, StreamClient
from serving.app import create_app
from tests.support.api import bearer, running
from tests.support.streams import T0, World, stream_settings

DEADLINE_S = 15.0


def _chunked(body: bytes, sizes: tuple[int, ...]) -> bytes:
    out, at = b"", 0
    for size in sizes:
        piece = body[at:at + size]
        out += b"%x;ext=1\r\n" % len(piece) + piece + b"\r\n"
        at += size
    return out + b"%x\r\n" % (len(body) - at) + body[at:] + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_the_parser_reads_events_split_anywhere_in_a_chunked_body(step: int):
    body = (b": ping - 2026\r\n\r\nid: A1\r\nevent: add\r\ndata: {\"entry\": 1}\r\n\r\n"
            b"event: reset\ndata: a\ndata: b\nid: B2\nretry: 5\n\n"
            b"event: end\r\ndata: {\"reason\": \"too_slow\"}\r\n\r\n")
    raw = _chunked(body, (7, 30, 2))
    parser, events = Parser(), []
    for at in range(0, len(raw), step):
        events += parser.feed(raw[at:at + step])
    assert events == [Event("comment", "ping - 2026"), Event("add", '{"entry": 1}', "A1"),
                      Event("reset", "a\nb", "B2"), Event("end", '{"reason": "too_slow"}')]
    assert parser.done
    with pytest.raises(StreamError, match="chunk size"):
        Parser().feed(b"zz\r\n")


def test_push_latency_is_joined_across_processes_whichever_report_comes_first():
    master, writer, reader = PushLog(measure_from=100.0), PushLog(), PushLog()
    reader.receive(7, 101.5, connected_at=99.0)  # its accept comes in a later report
    reader.receive(8, 103.0, connected_at=102.0)  # accepted before this stream connected
    reader.receive(9, 104.0, connected_at=99.0)  # a probe's post: no load user's accept
    reader.receive(6, 100.9, connected_at=90.0)  # accepted in the warm-up
    master.merge(reader.drain())
    master.join()
    assert master.samples == [] and len(master.pending) == 4
    writer.accept(7, 101.0, writer=10)
    writer.accept(8, 101.0, writer=12)
    writer.accept(6, 99.5, writer=10)
    master.merge(writer.drain())
    master.join()
    assert master.samples == [(10, 101.0, 0.5)]
    figures = master.to_dict()
    assert (figures["accepted"], figures["unmatched"], figures["caught_up"],
            figures["warmup"]) == (2, 1, 1, 1)
    assert reader.drain() == {"accepted": [], "received": []}  # drained once, shipped once


def test_push_percentiles_are_split_by_the_writers_class():
    # 1..1000 ms from normal author 10, ten times as slow from celebrity 12.
    samples = [(10, 0.0, i / 1000) for i in range(1, 1001)]
    samples += [(12, 0.0, i / 100) for i in range(1, 1001)]
    figures = push_summary({"samples": samples, "accepted": 2000}, {12}, 60.0)
    normal, celebrity = figures["normal"], figures["celebrity"]
    assert normal["count"] == celebrity["count"] == 1000
    assert normal["p50"] == pytest.approx(500, rel=0.01)
    assert normal["p99"] == pytest.approx(990, rel=0.01)
    assert normal["p99.9"] == pytest.approx(999, rel=0.01) and normal["max"] == pytest.approx(
        1000, rel=0.01)
    assert celebrity["p99"] == pytest.approx(9900, rel=0.01)
    assert figures["all"]["count"] == 2000
    unknown = push_summary({"samples": samples}, None, 60.0)
    assert unknown["normal"] is None and unknown["all"]["count"] == 2000
    assert {k: h.get_total_count() for k, h in classify(samples, {10, 12}).items()} == {
        "normal": 0, "celebrity": 2000}


def test_open_streams_add_up_over_processes_but_not_over_one_process_reports():
    master, a, b = StreamTally(), StreamTally(process="a"), StreamTally(process="b")
    for tally in (a, b):
        for _ in range(3):
            tally.opened(10.2, resumed=False)
        tally.event(10.3, "add")
        tally.event(10.4, "comment")
    master.merge(a.drain())
    a.closed(10.6, "left")  # the same second, reported again after a drain
    a.event(10.7, "end", "too_slow")
    master.merge(a.drain())
    master.merge(b.drain())
    assert master.open_series() == [(10.0, 6)]
    assert master.event_series() == [(10.0, 3.0)]  # heartbeats are not events
    assert master.counts["connects"] == 6 and master.ended == {"too_slow": 1}


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path / "stream.sqlite")


def test_a_stream_client_times_pushes_and_resumes_with_its_last_id(world: World):
    # Reader 2 follows 10, 11, 12 and 13; 12 and 13 are celebrities (read-time merge).
    push, tally, connects = PushLog(), StreamTally(), []
    since = (T0 + 5_000) / 1000
    habits = Habits(limit=5, hold_s=1_000, away_s=0.0)
    with running(create_app(stream_settings(world.path))) as base:
        client = StreamClient(base, 2, bearer(2), habits, random.Random(1), push, tally, since,
                              connects.append)
        leave = threading.Event()
        first = _session(client, leave)
        _until(lambda: tally.events["add"] >= 5, "the first page as adds")
        for tweet, author in ((900, 10), (901, 12)):
            push.accept(tweet, time.time(), author)
            world.run(Post(tweet, author, T0 + 10_000 + tweet, "pushed"))
        _until(lambda: tally.events["add"] >= 7, "the two posts pushed")
        leave.set()
        first.join(DEADLINE_S)
        push.accept(902, time.time(), 11)  # while away: sent by the resume, not pushed
        world.run(Post(902, 11, T0 + 10_902, "missed"))
        time.sleep(0.3)
        leave.clear()
        second = _session(client, leave)
        _until(lambda: tally.events["add"] >= 8, "the missed post on resume")
        leave.set()
        second.join(DEADLINE_S)
    assert [(c.status, c.resumed, c.error) for c in connects] == [(200, False, None),
                                                                   (200, True, None)]
    assert tally.counts["left"] == 2 and tally.events["reset"] == 0
    assert tally.events["add"] == 8, "a resume sends only what was missed"
    push.join()
    assert sorted(w for w, _, _ in push.samples) == [10, 12]
    assert all(0 <= latency < 5 for _, _, latency in push.samples), push.samples
    assert push.counts["caught_up"] == 1 and not push.pending
    assert celebrities_of(ModeRun("fanout", {"meta": {"celebrities": ["12", 13]}})) == {12, 13}
    assert celebrities_of(ModeRun("fanout", {"meta": {}})) is None


def _session(client: StreamClient, leave: threading.Event) -> threading.Thread:
    thread = threading.Thread(target=client.session, args=(leave.is_set,), daemon=True)
    thread.start()
    return thread


def _until(condition, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
        time.sleep(0.02)


def test_a_refused_connect_is_a_failed_connect_with_its_status(world: World):
    push, tally, connects = PushLog(), StreamTally(), []
    with running(create_app(stream_settings(world.path))) as base:
        client = StreamClient(base, 2, bearer(3), Habits(hold_s=1), random.Random(1), push,
                              tally, 0.0, connects.append)
        how = client.session()  # another user's token on 2's stream: refused
    assert how == "error" and connects[0].status == 403 and connects[0].error
    assert tally.counts == {"failed_connects": 1} and tally.open == 0


def test_the_report_shows_push_latency_by_class_and_the_streams(tmp_path: Path):
    tally = StreamTally(process="p")
    for second in range(100, 110):
        tally.opened(second + 0.1, resumed=second > 100)
        tally.event(second + 0.2, "add")
        tally.closed(second + 0.9, "left")
    tally.event(109.95, "end", "too_slow")
    samples = [[10, 101.0, 0.2], [12, 102.0, 1.5], [10, 103.0, 0.4]]
    results = {"meta": {"started_at": 99.0, "measure_from": 100.0, "stopped_at": 110.0,
                        "celebrities": [12], "options": {"fanout_rate": 0}},
               "recording": _empty_recording(), "expected": {},
               "push": {"samples": samples, "accepted": 3, "unmatched": 0, "caught_up": 0},
               "streams": tally.to_dict()}
    summary = build([ModeRun("fanout", results)], {"name": "streams"}, tmp_path)
    figures = summary["modes"]["fanout"]
    push, streams = figures["push_latency"], figures["streams"]
    assert (push["normal"]["count"], push["celebrity"]["count"]) == (2, 1)
    assert push["celebrity"]["max"] == pytest.approx(1500, rel=0.01)
    assert (streams["connects"], streams["resumes"], streams["open_max"]) == (10, 9, 1)
    assert streams["events_per_s"] == pytest.approx(1.1)  # ten adds and an end in 10 s
    assert streams["cut_off"] == {"too_slow": 1, "dropped": 0}
    assert (tmp_path / "streams-fanout.png").stat().st_size > 1000
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["modes"]["fanout"]["push_latency"]["celebrity"]["count"] == 1
    assert "at a follower holding a live stream" in (tmp_path / "report.html").read_text()


def _empty_recording() -> dict:
    from loadgen.recording import Recorder

    return Recorder(100.0).to_dict()

