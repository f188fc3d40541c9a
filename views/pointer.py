"""Which view the API serves: a small file naming the store and checkpoint in use.

A run directory can hold more than one view of the same log — the live one, and a
new one built beside it from the topics (``fanout rebuild --beside``), or the old one
kept after a switch for a rollback. ``<run>/view.json`` names the one in use
(``current``) and the one it replaced (``previous``), each a :class:`ViewRecord`: its
number, store URL, checkpoint directory and the ``FANOUT_*`` view settings it was
built with. It is replaced whole, by writing a new file and renaming it over the
old one, so a reader sees the old content or the new, never a mix; the API's
workers watch it (:mod:`serving.switch`) and switch every request after the rename
to the new store. Each worker then acknowledges what it serves in
``<run>/views/served/<pid>.json`` (:func:`acknowledge`), which is how the switch
knows every worker has moved (:func:`serving_workers`).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import psutil

#: The pointer's name in a run directory, and the directory of the views built beside.
POINTER_FILE: Final = "view.json"
VIEWS_DIR: Final = "views"
#: Environment variable that tells the API which pointer file to follow.
VIEW_FILE_ENV: Final = "FANOUT_VIEW_FILE"


@dataclass(frozen=True)
class ViewRecord:
    """One view: where its store and checkpoint are, and the settings it was built with."""

    number: int
    store_url: str
    checkpoint_dir: str
    #: The FANOUT_* view settings of its job (timeline cap, threshold, buckets, ...).
    settings: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Pointer:
    """The content of ``view.json``."""

    current: ViewRecord
    previous: ViewRecord | None = None
    #: Counts the switches, so that a switch back to an earlier view is a change too.
    switch: int = 0

    @classmethod
    def from_json(cls, text: str) -> Pointer:
        raw = json.loads(text)
        prev = raw.get("previous")
        return cls(ViewRecord(**raw["current"]), ViewRecord(**prev) if prev else None,
                   int(raw.get("switch", 0)))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def read(path: Path) -> Pointer | None:
    """The pointer at ``path``, or None if there is none."""
    try:
        return Pointer.from_json(path.read_text())
    except FileNotFoundError:
        return None


def write(path: Path, pointer: Pointer) -> None:
    """Replace the pointer at ``path`` atomically (a new file renamed over the old)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w") as out:
        out.write(pointer.to_json())
        out.flush()
        os.fsync(out.fileno())
    tmp.replace(path)


def served_dir(pointer_path: Path) -> Path:
    """Where the API's workers acknowledge the view they serve."""
    return pointer_path.parent / VIEWS_DIR / "served"


def acknowledge(pointer_path: Path, record: ViewRecord, switch: int) -> None:
    """Say (as this API worker) that every request from now on reads ``record``."""
    where = served_dir(pointer_path)
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"number": record.number, "store_url": record.store_url,
                               "switch": switch}))
    tmp.replace(where / f"{os.getpid()}.json")


def serving_workers(pointer_path: Path) -> dict[int, dict[str, Any]]:
    """What each live API worker last acknowledged: pid -> {number, store_url, switch}.

    Files of processes that are gone are removed.
    """
    found: dict[int, dict[str, Any]] = {}
    where = served_dir(pointer_path)
    for ack in where.glob("*.json") if where.is_dir() else ():
        pid = int(ack.stem)
        if not psutil.pid_exists(pid):
            ack.unlink(missing_ok=True)
            continue
        try:
            found[pid] = json.loads(ack.read_text())
        except (OSError, ValueError):
            continue
    return found
