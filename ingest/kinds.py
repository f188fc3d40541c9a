"""How a kind of record is declared, and what follows from its declaration.

``ingest.events`` declares each kind of changelog record once, as a row of its table
``KINDS``: a :class:`RecordKind` naming its code, its op, its event class, how a body
of it is validated, and its *flat form* (:class:`Columns`), the eight columns every
kind shares, in which the view carries a record (``views.row``'s event columns,
``views.join.Change``). This module holds the row's type and derives from rows what
the rest of the code needs, so that nothing else lists the kinds: the fields a body
may hold (:attr:`RecordKind.allowed`), the flat form of an event and back
(:func:`flattener`, :meth:`RecordKind.event_of`) and the JSON that encodes one
(:func:`writer`). No kind is named here.

The event classes derive from :class:`Record`, dataclasses whose fields, in order,
are a record's body: a kind's body is its event's fields but those its op implies
(``implied``: a follow's ``active``, a block's ``relation``), which come last.
"""

from __future__ import annotations

import dataclasses
import json.encoder
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, Final, NamedTuple

#: A record's flat form: its kind's code, then the columns of :class:`Columns`.
FLAT_COLUMNS: Final = ("kind", "key", "created_at", "tweet_id", "other_id", "ref_id", "text",
                       "name")
#: One record's flat form, in :data:`FLAT_COLUMNS` order.
Flat = tuple[int, int, int, int, int, int, str | None, str | None]
#: A record's body fields in its kind's order (:attr:`RecordKind.body`): what a parser
#: returns.
Fields = tuple[Any, ...]
#: Columns of the flat form that hold text; the others hold integers.
TEXT_COLUMNS: Final = frozenset({"text", "name"})


class Record:
    """What every event class shares: its topic, and the flat form's unused columns.

    The latter are class constants, so that one ``attrgetter`` reads a whole flat form
    (:func:`flattener`).
    """

    __slots__ = ()
    topic: ClassVar[str]
    _NO_ID: ClassVar[int] = 0
    _NO_TEXT: ClassVar[str | None] = None


class Columns(NamedTuple):
    """Which field of a kind's event each column of its flat form holds (None: unused).

    ``key`` holds the join key; ``created_at``, not listed, the event time (every event
    has one); ``tweet_id``, ``other_id`` and ``ref_id`` ids (0 when unused); ``text``
    and ``name`` text (None when unused). Every field of a record's body has a column,
    so that the flat form carries the whole record.
    """

    key: str
    tweet_id: str | None = None
    other_id: str | None = None
    ref_id: str | None = None
    text: str | None = None
    name: str | None = None

    def fields(self) -> tuple[str | None, ...]:
        """The event field of each column after ``kind``, in :data:`FLAT_COLUMNS` order."""
        return (self.key, "created_at", self.tweet_id, self.other_id, self.ref_id, self.text,
                self.name)


#: Validates the JSON body of a record of the kind given and returns its body fields
#: (:attr:`RecordKind.body`, in order), or raises :class:`~ingest.errors.InvalidEvent`
#: with the reason.
Parser = Callable[[dict[str, Any], "RecordKind"], Fields]


@dataclass(frozen=True, slots=True)
class RecordKind:
    """One kind of record, declared once: a row of ``ingest.events.KINDS``.

    ``kind`` is its code (what the view carries and keeps), ``op`` its op on the wire
    and ``event`` its event class; ``parse`` validates a body of this op and returns
    its fields (:meth:`event_from` makes them the event, :meth:`flat_of` the flat form);
    ``columns`` is its flat form; ``implied`` are the event's arguments that the op
    stands for. Derived: ``topic`` (the event class's); ``make``, the event class as a
    callable; ``body``, the fields of its JSON body after ``v`` and ``op``, in order;
    ``allowed``, every name a body may hold; ``key_at``, where the join key is among
    the body's fields.
    """

    kind: IntEnum
    op: str
    event: type[Record]
    parse: Parser
    columns: Columns
    implied: dict[str, Any] = dataclasses.field(default_factory=dict)
    topic: str = dataclasses.field(init=False)
    make: Callable[..., Any] = dataclasses.field(init=False, repr=False)
    body: tuple[str, ...] = dataclasses.field(init=False)
    allowed: frozenset[str] = dataclasses.field(init=False)
    key_at: int = dataclasses.field(init=False)
    #: Where each body field sits among the flat form's columns after ``kind``, and
    #: which of the fields are text (:meth:`event_of`).
    _slots: tuple[int, ...] = dataclasses.field(init=False, repr=False)
    _texts: tuple[int, ...] = dataclasses.field(init=False, repr=False)
    #: The flat form's columns after ``kind`` picked from the body's fields followed
    #: by ``_fixed``, the columns no body field fills (:meth:`flat_of`).
    _pick: Callable[[Fields], tuple[Any, ...]] = dataclasses.field(init=False, repr=False)
    _fixed: tuple[Any, ...] = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        names = [f.name for f in dataclasses.fields(self.event)]  # type: ignore[arg-type]
        body = tuple(n for n in names if n not in self.implied)
        if names[:len(body)] != list(body):
            msg = f"{self.event.__name__}: the fields an op implies must come last"
            raise TypeError(msg)
        columns = self.columns.fields()
        missing = [n for n in body if n not in columns]
        if missing:
            msg = f"{self.event.__name__}.{missing[0]} has no column in the flat form"
            raise TypeError(msg)
        slots = tuple(columns.index(n) for n in body)
        texts = tuple(i for i, slot in enumerate(slots) if FLAT_COLUMNS[slot + 1] in TEXT_COLUMNS)
        picks, fixed = self._picks(body, columns)
        for name, value in (("topic", self.event.topic), ("make", self.event),
                            ("body", body), ("allowed", frozenset({"v", "op", *body})),
                            ("key_at", body.index(self.columns.key)),
                            ("_slots", slots), ("_texts", texts),
                            ("_pick", itemgetter(*picks)), ("_fixed", fixed)):
            object.__setattr__(self, name, value)

    def _picks(self, body: tuple[str, ...], columns: tuple[str | None, ...]
               ) -> tuple[list[int], tuple[Any, ...]]:
        """For each column after ``kind``: its body field's place, else a fixed value's."""
        picks: list[int] = []
        fixed: list[Any] = []
        for name, column in zip(columns, FLAT_COLUMNS[1:], strict=True):
            if name in body:
                picks.append(body.index(name))
                continue
            picks.append(len(body) + len(fixed))
            if name in self.implied:
                fixed.append(self.implied[name])
            else:  # unused: what Record's constants give an event's flat form
                fixed.append(Record._NO_TEXT if column in TEXT_COLUMNS else Record._NO_ID)
        return picks, tuple(fixed)

    def field_types(self) -> dict[str, type]:
        """Each body field and its JSON type: ``str`` in a text column, else ``int``."""
        return {name: str if FLAT_COLUMNS[slot + 1] in TEXT_COLUMNS else int
                for name, slot in zip(self.body, self._slots, strict=True)}

    def event_from(self, fields: Fields) -> Any:
        """The event of a body's fields (what :attr:`parse` returns)."""
        return self.make(*fields, **self.implied)

    def flat_of(self, fields: Fields) -> Flat:
        """The flat form of a body's fields: its event's, without making the event."""
        return (self.kind, *self._pick(fields + self._fixed))  # type: ignore[return-value]

    def event_of(self, columns: Sequence[Any]) -> Any:
        """The event whose flat form is this kind's code and ``columns`` (key onwards)."""
        args = [columns[slot] for slot in self._slots]
        for i in self._texts:
            if args[i] is None:
                args[i] = ""
        return self.make(*args, **self.implied)


def by_class(kinds: Iterable[RecordKind]) -> dict[type, list[RecordKind]]:
    """``kinds`` grouped by event class (a follow and an unfollow share one)."""
    out: dict[type, list[RecordKind]] = {}
    for kind in kinds:
        out.setdefault(kind.event, []).append(kind)
    return out


def flattener(kinds: list[RecordKind]) -> Callable[[Any], Flat]:
    """The flat form of the records of one event class, whose ``kinds`` these are.

    One ``attrgetter`` reads it whole, unused columns from :class:`Record`'s constants.
    Where a class has several kinds (Follow: follow and unfollow), the fields its ops
    imply tell which kind an event is.
    """
    columns = kinds[0].columns
    if any(k.columns != columns or k.implied.keys() != kinds[0].implied.keys() for k in kinds):
        msg = f"the kinds of {kinds[0].event.__name__} differ in their columns or implied fields"
        raise TypeError(msg)
    names = [name or ("_NO_TEXT" if FLAT_COLUMNS[i + 1] in TEXT_COLUMNS else "_NO_ID")
             for i, name in enumerate(columns.fields())]
    get = attrgetter(*names)
    if len(kinds) == 1:
        code = kinds[0].kind
        return lambda event: (code, *get(event))
    implied = list(kinds[0].implied)
    which = attrgetter(*implied)  # one name: the value itself, not a tuple of one
    codes = {(k.implied[implied[0]] if len(implied) == 1
              else tuple(k.implied[name] for name in implied)): k.kind for k in kinds}
    return lambda event: (codes[which(event)], *get(event))


def writer(kind: RecordKind, version: int) -> Callable[[Any], bytes]:
    """How the records of ``kind``'s event class are written: the value of each.

    Compact JSON: ``v`` (``version``), ``op``, then the body's fields in order, an
    integer in decimal and text escaped as :mod:`json` escapes it, so for events of
    the contract's types the bytes are ``json.dumps(body, separators=(",", ":"))``'s,
    at a third of its cost (a format string per class, not a dict per record). A field
    with a default comes after the others (a dataclass rule) and is left out when it
    has it, as a post that is not a reply leaves out ``in_reply_to_user_id``.
    """
    types = kind.field_types()
    defaults = {f.name: f.default for f in dataclasses.fields(kind.event)  # type: ignore[arg-type]
                if f.default is not dataclasses.MISSING}
    fixed = [name for name in kind.body if name not in defaults]
    optional = [(name, defaults[name], types[name] is str) for name in kind.body
                if name in defaults]
    texts = [i for i, name in enumerate(fixed) if types[name] is str]
    get = _tuple_of(fixed)
    head = f'{{"v":{version},"op":%s' + "".join(f',"{name}":%s' for name in fixed)

    def write(event: Any) -> bytes:
        values = list(get(event))
        for i in texts:
            values[i] = _quoted(values[i])
        out = head % (_quoted(event.op), *values)
        for name, default, text in optional:
            value = getattr(event, name)
            if value != default:
                out += f',"{name}":{_quoted(value) if text else value}'
        return (out + "}").encode()

    return write


_quoted: Final = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def _tuple_of(names: Sequence[str]) -> Callable[[Any], tuple[Any, ...]]:
    """A getter of the attributes ``names`` of an event, as a tuple however many."""
    if not names:
        return lambda event: ()
    get = attrgetter(*names)
    return get if len(names) > 1 else lambda event: (get(event),)
