"""The changelogs read in batch, from the beginning to their end.

``fanout verify`` recomputes the view from here, independently of the streaming
job's state: every partition of every topic is read from its earliest offset to the
end Kafka lists for it (:class:`~views.kafka_offsets.EndOffsets`), through the same
row decoding as either stream source (:func:`~views.source.event_row`), so all see
the same events and the same invalid records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from ingest.events import Event
from ingest.settings import KafkaSettings
from views.kafka_offsets import EndOffsets
from views.row import EVENT_COLUMNS, Kind, to_event
from views.source import KafkaRange, SourceOptions, read_ranges


@dataclass
class Changelog:
    """All events in the topics, plus what could not be decoded."""

    events: list[Event] = field(default_factory=list)
    invalid: Counter[str] = field(default_factory=Counter)
    ends: dict[tuple[str, int], int] = field(default_factory=dict)


def read_changelog(kafka: KafkaSettings, idle_timeout: float = 30.0,
                   until: dict[tuple[str, int], int] | None = None,
                   since: Mapping[tuple[str, int], int] | None = None) -> Changelog:
    """Read every topic from its earliest offset to its end.

    ``until`` (logical topic, partition -> end offset, exclusive) stops earlier: the
    log as a view that applied exactly that much saw it (a partition it does not
    name is read to nothing). ``since`` (the same keys, the first offset to read)
    starts later: the records after an earlier read's ``until``, to go on with
    (:meth:`views.reference.Reference.add` takes them as the log's continuation).
    """
    offsets = EndOffsets(kafka.bootstrap)
    tps = offsets.topic_partitions(kafka.physical_topics())
    starts, ends = offsets.earliest(tps), offsets.ends(tps)
    if until is not None:
        ends = {(t, p): min(end, until.get((kafka.logical(t), p), 0))
                for (t, p), end in ends.items()}
    if since is not None:
        starts = {(t, p): max(start, since.get((kafka.logical(t), p), 0))
                  for (t, p), start in starts.items()}
    options = SourceOptions(bootstrap=kafka.bootstrap, topic_prefix=kafka.topic_prefix,
                            read_timeout=idle_timeout)
    out = Changelog()
    ranges = []
    for (topic, part), end in sorted(ends.items()):
        out.ends[(kafka.logical(topic), part)] = end
        ranges.append(KafkaRange(topic, part, starts[(topic, part)], end))
    for _, batch in read_ranges(options, ranges):
        _collect(batch.to_pydict(), out)
    return out


def _collect(columns: dict[str, list], out: Changelog) -> None:
    rows = zip(*(columns[name] for name in EVENT_COLUMNS), strict=True)
    for fields, error in zip(rows, columns["error"], strict=True):
        if fields[0] == Kind.INVALID:
            out.invalid[(error or "invalid").split(":")[0]] += 1
        else:
            out.events.append(to_event(*fields))
